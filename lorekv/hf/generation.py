"""transformers' ``generate`` (and any model call) on a :class:`~lorekv.hf.compressed.CompressedCache`.

Two pieces, installed on a model by :func:`install` (which :func:`lorekv.hf.attention.prepare`
calls, so ``Pipeline.compress`` has done it before the user holds a compressed cache):

- **Forward hooks.** A call ``model(..., cache=compressed)`` (what ``generate`` makes at every
  step) runs as a lorekv forward pass: a pre-hook places the fed tokens at each row's next
  positions (a token the ``attention_mask`` marks as padding is stored masked, taking no
  position), checks any ``position_ids`` the caller gave against them, and publishes them to
  the cache and the attention function (:mod:`lorekv.hf.context`); a post-hook closes the pass
  and advances the cache. transformers needs no help beyond that: the cache's
  ``get_seq_length`` is the count of columns it covers, so ``generate`` feeds exactly the
  not-yet-cached suffix.
- **A checked ``generate``.** A ``Cache`` never sees ``generate``'s options, and transformers
  calls the cache the first time after preparing inputs; so :func:`install` sets the model's
  ``generate`` to :func:`checked_generate`, which refuses, before any model work and naming the
  option, what a compressed cache cannot continue (beam search, assisted decoding, other rows
  than the compressed ones, a prompt other than the compressed one, padding other than left
  padding, a cache already extended, ``cache_implementation``), then calls transformers' own
  ``generate`` unchanged. Calls without a compressed cache go straight through.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode

from lorekv.hf.cache import PADDING
from lorekv.hf.compressed import CompressedCache
from lorekv.hf.context import ATTENTION_NAME, ForwardPass, active_pass, enter, leave
from lorekv.hf.inputs import check_rows_context
from lorekv.hf.introspection import layer_windows

SUPPORTED_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
"""``generate``'s decoding modes that continue a compressed cache: greedy search and sampling."""

_INSTALLED = "_lorekv_generate_installed"

RESERVED_TOKENS = 256
"""Room reserved up front in each full-attention layer for the tokens a ``generate`` call may
append; past it the room doubles as needed (:meth:`PositionedLayer.append`), so a large
``max_new_tokens`` that stops early at eos allocates no more than it used."""


def install(model: PreTrainedModel) -> None:
    """Make ``model`` continue compressed caches: the forward hooks and :func:`checked_generate`
    (idempotent; without effect on calls that pass no compressed cache)."""
    if getattr(model, _INSTALLED, False):
        return
    model.register_forward_pre_hook(_open_pass, with_kwargs=True)
    model.register_forward_hook(_close_pass, with_kwargs=True, always_call=True)
    if isinstance(model, GenerationMixin):
        model.generate = functools.partial(checked_generate, model)  # a partial pickles, a bound method does not
    setattr(model, _INSTALLED, True)


def _cache_of(kwargs: dict[str, Any]) -> Any:
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _open_pass(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """Forward pre-hook: run a call on a compressed cache at the cache's next positions."""
    cache = _cache_of(kwargs)
    if not isinstance(cache, CompressedCache):
        return None
    current = active_pass()
    if current is not None and current.cache is cache:
        return None  # lorekv.hf.attention.forward already publishes explicit positions
    if cache.damaged:
        raise ValueError("the compressed cache was left incomplete by a failed model call; use a fork taken before it")
    attention = getattr(module.config, "_attn_implementation", None) if isinstance(module, PreTrainedModel) else None
    if attention is not None and attention != ATTENTION_NAME:
        raise ValueError(
            f"the model's attention implementation is {attention!r}; a compressed cache needs lorekv's, which "
            "masks evicted and padded slots by position: call lorekv.hf.prepare(model) first"
        )
    tokens = kwargs.get("input_ids", args[0] if args else None)
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    batch, length = tokens.shape[0], tokens.shape[1]
    if batch != cache.batch_size:
        raise ValueError(
            f"the compressed cache holds {cache.batch_size} row(s); this call feeds {batch} rows "
            "(other input_ids, or num_beams / num_return_sequences > 1)"
        )
    device = module.device if isinstance(module, PreTrainedModel) else tokens.device
    mask = kwargs.get("attention_mask")
    padded = mask is not None and mask.dim() == 2 and (batch > 1 or cache.extended == 0) and length > 1
    padded = padded and not bool(mask[:, -length:].all())  # one read a prompt or question, none a decode step
    starts = cache.row_positions.to(device)[:, None]
    if padded:
        real = mask[:, -length:].to(device).bool()
        positions = (starts + real.long().cumsum(1) - 1).masked_fill(~real, PADDING)
    else:  # a decode step: no work beyond the row's next position
        real = None
        positions = starts if length == 1 else starts + torch.arange(length, device=device)
    given = kwargs.get("position_ids")
    if given is not None and not cache.positions_checked:
        differ = given.reshape(batch, -1).to(device) != positions
        if bool((differ if real is None else differ & real).any()):
            got = given.reshape(-1).tolist()
            raise ValueError(
                f"position_ids {got[:3]}{'...' if len(got) > 3 else ''} do not continue the compressed cache, "
                f"whose rows continue at positions {cache.row_positions.tolist()} (pass input_ids that start with "
                "the compressed prompts, and their attention_mask)"
            )
    capture = None
    if cache.bound is not None:
        cache.bound.before_pass(kwargs.get("input_ids", args[0] if args else None))
        capture = cache.bound.capture()
    forward_pass = ForwardPass(cache, positions, capture=capture, padded=padded, owner=module)
    enter(forward_pass)
    return args, {**kwargs, "position_ids": positions.clamp(min=0) if padded else positions}


def _close_pass(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    """Forward hook (also run when the call raised): close the pass :func:`_open_pass` opened and
    advance the cache by the fed tokens, or mark it damaged if the call failed."""
    current = active_pass()
    if current is None or current.owner is not module:
        return
    leave(current)
    cache = current.cache
    if output is None:
        cache.damaged = True
    else:
        fed = current.query_positions.shape[1]
        real = (current.query_positions != PADDING).sum(1) if current.padded else fed
        cache.next_position += fed
        cache.row_positions = cache.row_positions.to(current.query_positions.device) + real
        if cache.bound is not None:
            counts = real.tolist() if current.padded else [fed] * cache.batch_size
            logits = output.logits if hasattr(output, "logits") else output[0]
            try:
                cache.bound.after_pass(cache, current, logits, counts)
            except BaseException:
                cache.damaged = True  # a compression that failed midway may have stored some layers only
                raise


def checked_generate(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
    """transformers' ``generate``, after :func:`check_generate` when the cache passed
    (``past_key_values=`` or ``cache=``) is a :class:`CompressedCache`."""
    cache = _cache_of(kwargs)
    if not isinstance(cache, CompressedCache):
        return type(self).generate(self, *args, **kwargs)
    extra = check_generate(self, cache, args, kwargs)
    if cache.bound is None:
        cache.reserve(cache.batch_size, min(extra, RESERVED_TOKENS))
    else:  # room up to the schedule's bound, reserved when the layers are stored after each compression
        cache.reserve(cache.batch_size, min(extra, cache.bound.room()))
    # generate derives each step's position_ids from the attention_mask just checked: comparing them
    # with the cache's own at every step would read the device once a step for nothing
    cache.positions_checked = "position_ids" not in kwargs
    try:
        return type(self).generate(self, *args, **kwargs)
    finally:
        cache.positions_checked = False


def check_options(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, dict, dict]:
    """Refuse, naming the option, the ``generate`` options a compressed cache cannot
    continue (beam search, assisted decoding, other modes than greedy and sampling, several
    sequences, ``cache_implementation``, ``use_cache=False``, ``inputs_embeds``); needs no cache,
    so callers that compress first (``Pipeline.generate``, the text pipeline) refuse before any
    model work. Returns the merged generation config, the bound arguments and the options.

    Reads transformers' private ``_prepare_generation_config`` (the merge ``generate`` itself
    makes of the model's config and the call's options); transformers is pinned below 6.
    """
    bound = inspect.signature(GenerationMixin.generate).bind(model, *args, **kwargs).arguments
    options = dict(bound.get("kwargs", {}))
    assistant = bound.get("assistant_model")
    options.pop("past_key_values", None), options.pop("cache", None)
    config, _ = model._prepare_generation_config(bound.get("generation_config"), **options)
    refusals = {
        "assistant_model (assisted decoding)": assistant is not None,
        "prompt_lookup_num_tokens (assisted decoding)": config.prompt_lookup_num_tokens is not None,
        "assistant_early_exit (assisted decoding)": config.assistant_early_exit is not None,
        "use_mtp (assisted decoding)": bool(getattr(config, "use_mtp", False)),
        f"num_beams={config.num_beams} (beam search)": (config.num_beams or 1) > 1,
        "constraints / force_words_ids (constrained beam search)": (
            config.constraints is not None or config.force_words_ids is not None
        ),
        f"num_return_sequences={config.num_return_sequences}": (config.num_return_sequences or 1) > 1,
        f"cache_implementation={config.cache_implementation!r}": config.cache_implementation is not None,
        f"penalty_alpha={config.penalty_alpha} (contrastive search)": (
            config.penalty_alpha is not None and config.penalty_alpha > 0 and (config.top_k or 0) > 1
        ),
        "dola_layers (DoLa decoding)": config.dola_layers is not None,
        "use_cache=False": config.use_cache is False,
        "inputs_embeds": bound.get("kwargs", {}).get("inputs_embeds") is not None,
    }
    refused = [name for name, hit in refusals.items() if hit]
    mode = config.get_generation_mode(assistant)
    if not refused and mode not in SUPPORTED_MODES:
        refused = [f"the {mode.value} generation mode"]
    if refused:
        raise ValueError(
            f"a compressed cache continues greedy search and sampling (num_beams=1) only; refused: {', '.join(refused)}"
        )
    return config, bound, options


def check_generate(model: PreTrainedModel, cache: CompressedCache, args: tuple, kwargs: dict[str, Any]) -> int:
    """Refuse, naming the option, a ``generate`` call that cannot continue ``cache``; return how
    many tokens the call appends at most (fed suffix plus new tokens).

    Raises:
        ValueError: beam search, assisted decoding or another mode than greedy/sampling;
            ``num_return_sequences`` > 1; ``cache_implementation``; ``use_cache=False``;
            ``inputs_embeds``; ``input_ids`` not (1, m) or not starting with the compressed prompt,
            or adding nothing to what the cache holds; an ``attention_mask`` with padding; a cache
            already extended by an earlier call (fork it instead); a cache with other layers than
            the model.
    """
    config, bound, options = check_options(model, args, kwargs)
    argument = "cache" if "cache" in kwargs else "past_key_values"  # as the caller named it
    if len(cache.layers) != len(layer_windows(model.config)):
        raise ValueError(f"the compressed cache has {len(cache.layers)} layers; this model is not the one compressed")
    if cache.damaged or cache.stored_past_next():
        raise ValueError(
            f"{argument} holds entries at or past its next position {cache.next_position}: it was fed "
            "outside generate (lorekv.hf.forward) or by a failed call; continue from a fork taken before: "
            "compressed.fork()"
        )
    if cache.extended:
        raise ValueError(
            f"{argument} was already extended by {cache.extended} tokens (an earlier generate call); "
            "continue each question from a fork taken before: compressed.fork()"
        )
    input_ids = bound.get("inputs", options.get("input_ids"))
    b, width = cache.prompt_ids.shape
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a ({b}, m) tensor starting with the compressed prompts")
    if input_ids.shape[0] != b:
        raise ValueError(f"input_ids has {input_ids.shape[0]} rows; the compressed cache holds {b}")
    m = input_ids.shape[1]
    prompt = cache.prompt_ids.to(input_ids.device)
    if m < width or not torch.equal(input_ids[:, :width], prompt):
        raise ValueError(
            f"input_ids must start with the {width} compressed prompt columns (the ids given to compress), "
            f"got {m} columns {'with another prefix' if m >= width else ''}".rstrip()
        )
    if m <= cache.start:
        raise ValueError(
            "input_ids add nothing to the compressed context: a query-agnostic cache needs the question "
            "appended (input_ids = context followed by question)"
        )
    mask = options.get("attention_mask")
    pad, eos = config.pad_token_id, config.eos_token_id
    eos = [] if eos is None else torch.as_tensor(eos).reshape(-1).tolist()
    pad_ids = None if pad is None else torch.as_tensor(pad, device=input_ids.device)
    inferred = pad_ids is not None and pad not in eos and bool(torch.isin(input_ids, pad_ids).any())
    compressed_mask = cache.attention_mask.to(input_ids.device)
    if mask is None and (inferred or not bool((compressed_mask == 1).all())):
        raise ValueError(
            f"input_ids hold {f'the pad token {pad}' if inferred else 'padding'} and no attention_mask is given: "
            "pass the attention_mask of the compressed prompts, extended over the rest (ones where there is no "
            "padding)"
        )
    if mask is not None:
        check_fed_mask(mask, compressed_mask, cache.start, m)
    new = config.max_new_tokens if config.max_new_tokens is not None else max(config.max_length - m, 0)
    fed = (m - cache.start) if mask is None else mask[:, cache.start :].to(compressed_mask.device).long().sum(1)
    check_rows_context(model, (cache.row_positions.to(compressed_mask.device) + fed).tolist(), new)
    return m - cache.start + new


def check_fed_mask(mask: torch.Tensor, compressed: torch.Tensor, start: int, m: int) -> None:
    """The ``attention_mask`` (b, m) of a ``generate`` call on a compressed cache: its first
    columns are the compressed prompts' mask, and what follows the compressed context (a
    question) is left-padded too, each row with at least one real token fed."""
    b, width = compressed.shape
    if tuple(mask.shape) != (b, m):
        raise ValueError(f"attention_mask must have the shape of input_ids, ({b}, {m}), got {tuple(mask.shape)}")
    mask = mask.to(compressed.device).long()
    if not torch.equal(mask[:, :width], compressed):
        raise ValueError("attention_mask must start with the compressed prompts' mask (the one given to compress)")
    rest = mask[:, width:]
    for row in range(b):
        real = int(rest[row].sum())
        zeros_then_ones = bool(((rest[row] == 0) | (rest[row] == 1)).all()) and bool(
            (rest[row, rest.shape[1] - real :] == 1).all()
        )
        if not zeros_then_ones:
            raise ValueError(
                f"attention_mask row {row}: the columns after the compressed prompt must be left padding "
                "(zeros, then ones)"
            )
        if real == 0 and start == width:
            raise ValueError(
                f"attention_mask row {row} feeds no token after the compressed context: every row needs a question"
            )
