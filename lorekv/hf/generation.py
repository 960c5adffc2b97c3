"""transformers' ``generate`` (and any model call) on a :class:`~lorekv.hf.compressed.CompressedCache`.

Two pieces, installed on a model by :func:`install` (which :func:`lorekv.hf.attention.prepare`
calls, so ``Pipeline.compress`` has done it before the user holds a compressed cache):

- **Forward hooks.** A call ``model(..., cache=compressed)`` (what ``generate`` makes at every
  step) runs as a lorekv forward pass: a pre-hook places the fed tokens at the cache's next
  positions, checks any ``position_ids`` the caller gave against them, and publishes them to the
  cache and the attention function (:mod:`lorekv.hf.context`); a post-hook closes the pass and
  advances the cache. transformers needs no help beyond that: the cache's ``get_seq_length`` is
  the count of positions it covers, so ``generate`` feeds exactly the not-yet-cached suffix.
- **A checked ``generate``.** A ``Cache`` never sees ``generate``'s options, and transformers
  calls the cache the first time after preparing inputs; so :func:`install` sets the model's
  ``generate`` to :func:`checked_generate`, which refuses, before any model work and naming the
  option, what a batch-1 compressed cache cannot continue (beam search, assisted decoding, a
  batch, a prompt other than the compressed one, a cache already extended,
  ``cache_implementation``), then calls transformers' own ``generate`` unchanged. Calls
  without a compressed cache go straight through.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode

from lorekv.hf.compressed import CompressedCache
from lorekv.hf.context import ATTENTION_NAME, ForwardPass, active_pass, enter, leave
from lorekv.hf.inputs import check_context
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
    if batch != 1:
        raise ValueError(
            f"a compressed cache holds one sequence (batch 1); this call feeds {batch} rows "
            "(input_ids with several rows, or num_beams / num_return_sequences > 1)"
        )
    device = module.device if isinstance(module, PreTrainedModel) else tokens.device
    positions = torch.arange(cache.next_position, cache.next_position + length, device=device)
    given = kwargs.get("position_ids")
    if given is not None and not torch.equal(given.reshape(-1).to(device), positions):
        got = given.reshape(-1).tolist()
        raise ValueError(
            f"position_ids {got[:3]}{'...' if len(got) > 3 else ''} do not continue the compressed cache, which "
            f"covers positions 0..{cache.next_position - 1}: {length} fed tokens take positions "
            f"{cache.next_position}..{cache.next_position + length - 1} (pass input_ids that start with the "
            "compressed prompt, and no attention_mask with padding)"
        )
    forward_pass = ForwardPass(cache, positions, owner=module)
    enter(forward_pass)
    return args, {**kwargs, "position_ids": positions.view(1, length)}


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
        cache.next_position += current.query_positions.shape[0]


def checked_generate(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
    """transformers' ``generate``, after :func:`check_generate` when the cache passed
    (``past_key_values=`` or ``cache=``) is a :class:`CompressedCache`."""
    cache = _cache_of(kwargs)
    if isinstance(cache, CompressedCache):
        extra = check_generate(self, cache, args, kwargs)
        cache.reserve(1, min(extra, RESERVED_TOKENS))
    return type(self).generate(self, *args, **kwargs)


def check_options(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, dict, dict]:
    """Refuse, naming the option, the ``generate`` options a batch-1 compressed cache cannot
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
    if len(cache.layers) != len(layer_windows(model.config)):
        raise ValueError(f"the compressed cache has {len(cache.layers)} layers; this model is not the one compressed")
    if cache.damaged or cache.stored_past_next():
        raise ValueError(
            f"past_key_values holds entries at or past its next position {cache.next_position}: it was fed "
            "outside generate (lorekv.hf.forward) or by a failed call; continue from a fork taken before: "
            "compressed.fork()"
        )
    if cache.extended:
        raise ValueError(
            f"past_key_values was already extended by {cache.extended} tokens (an earlier generate call); "
            "continue each question from a fork taken before: compressed.fork()"
        )
    input_ids = bound.get("inputs", options.get("input_ids"))
    n = cache.prompt_ids.shape[1]
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a (1, m) tensor starting with the compressed prompt")
    if input_ids.shape[0] != 1:
        raise ValueError(f"input_ids has {input_ids.shape[0]} rows; a compressed cache holds one sequence (batch 1)")
    m = input_ids.shape[1]
    prompt = cache.prompt_ids.to(input_ids.device)
    if m < n or not torch.equal(input_ids[:, :n], prompt):
        raise ValueError(
            f"input_ids must start with the {n} compressed prompt tokens (the ids given to compress), "
            f"got {m} tokens {'with another prefix' if m >= n else ''}".rstrip()
        )
    if m <= cache.start:
        raise ValueError(
            "input_ids add nothing to the compressed context: a query-agnostic cache needs the question "
            "appended (input_ids = context followed by question)"
        )
    mask = options.get("attention_mask")
    pad, eos = config.pad_token_id, config.eos_token_id
    eos = [] if eos is None else torch.as_tensor(eos).reshape(-1).tolist()
    inferred = pad is not None and pad not in eos and bool(torch.isin(input_ids, torch.as_tensor(pad)).any())
    if mask is None and inferred:
        raise ValueError(
            f"input_ids hold the pad token {pad} and no attention_mask is given: transformers would read it as "
            "padding and shift the positions; pass attention_mask=torch.ones_like(input_ids)"
        )
    if mask is not None and (tuple(mask.shape) != (1, m) or not bool((mask == 1).all())):
        raise ValueError(f"attention_mask must be all ones of shape (1, {m}) (no padding), got {tuple(mask.shape)}")
    new = config.max_new_tokens if config.max_new_tokens is not None else max(config.max_length - m, 0)
    check_context(model, m, new)
    return m - cache.start + new
