"""Decoding after compression, and the full-cache baseline: conveniences over ``model.generate``.

There is one decoding loop, transformers' own: :func:`decode` is ``model.generate`` on a fork
of a :class:`~lorekv.hf.compressed.CompressedCache` (which continues at the original
positions, the keys keeping their RoPE); :func:`continue_full` is the same on a cache that
evicted nothing; :func:`generate_full` is plain ``model.generate``. They add what lorekv's
callers use: greedy by default, no end-of-sequence stop unless ``eos_token_id`` is given, the
answer's tokens and first logits, the compression stats and the wall-clock time. Every other
``generate`` option passes through.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lorekv.hf.attention import prepare
from lorekv.hf.cache import PositionedCache
from lorekv.hf.compressed import CompressedCache, CompressionStats
from lorekv.hf.generation import check_options
from lorekv.hf.inputs import check_batch, check_context, check_rows_context, check_token_ids
from lorekv.hf.introspection import layer_windows, text_config
from lorekv.hf.timing import now
from lorekv.token_rules import TokenRule
from lorekv.validation import check_int_at_least


@dataclass(frozen=True)
class Generation:
    """A decoded answer.

    Attributes:
        token_ids: (k,) the generated tokens (eos included when it ended the answer).
        first_logits: (V,) the logits the first answer token was chosen from.
        stats: the compression stats of the cache it was decoded from (None: full cache).
        decode_seconds: wall-clock seconds of feeding the question and decoding.
    """

    token_ids: torch.Tensor
    first_logits: torch.Tensor
    stats: CompressionStats | None
    decode_seconds: float

    def text(self, tokenizer: PreTrainedTokenizerBase) -> str:
        """The answer as text, special tokens left out."""
        return tokenizer.decode(self.token_ids, skip_special_tokens=True)


class RuleProcessor(LogitsProcessor):
    """A :data:`~lorekv.token_rules.TokenRule` as a logits processor: every token but the rule's
    choice gets -inf, so greedy search picks exactly what the rule picks from the scores
    (B, V) it is given (the raw logits when no other processor runs first)."""

    def __init__(self, rule: TokenRule) -> None:
        self.rule = rule

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen = self.rule(scores)
        out = torch.full_like(scores, -torch.inf)
        return out.scatter(1, chosen.view(-1, 1), 0.0)


DECODING_SETS = frozenset(
    {"input_ids", "inputs", "attention_mask", "max_new_tokens", "return_dict_in_generate", "output_logits", "cache"}
)
"""``generate`` arguments lorekv's decoding sets itself (``max_new_tokens`` is its own argument)."""


def check_generate_options(model: PreTrainedModel, options: Mapping[str, Any]) -> None:
    """Refuse, before any model work and naming them, ``generate`` options that lorekv's decoding
    sets itself (:data:`DECODING_SETS`, and ``past_key_values``) or that a compressed cache cannot
    continue (beam search, assisted decoding, ...: :func:`lorekv.hf.generation.check_options`)."""
    clash = sorted((set(options) & DECODING_SETS) | ({"past_key_values"} & set(options)))
    if clash:
        raise ValueError(
            f"{', '.join(clash)}: set by lorekv's decoding itself (max_new_tokens is its own argument); "
            "call model.generate with a compressed cache to set them"
        )
    check_options(model, (), dict(options))


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    compressed: CompressedCache,
    question_ids: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
    decoding: Any = None,
    **generate_kwargs: Any,
) -> Generation:
    """``model.generate`` from a fork of a one-row ``compressed``, fed the pending prompt token(s)
    and ``question_ids`` (1, q); ``compressed`` itself is left intact, so it can answer several
    questions (:func:`decode_batch` answers every row of a batch). ``decoding``: a
    :class:`lorekv.schedule.DecodingSchedule` that keeps the cache within its budget while the
    answer is generated (None: the cache grows with the answer).

    Greedy unless ``rule`` (a token rule, applied as a logits processor) or ``generate_kwargs``
    (``do_sample=True, temperature=...``, a streamer, ...) say otherwise; stops at
    ``eos_token_id`` only (None: runs to ``max_new_tokens``, whatever the model's generation
    config says).
    """
    if compressed.batch_size != 1:
        raise ValueError(f"decode answers one row; this cache holds {compressed.batch_size}: use decode_batch")
    if question_ids is not None:
        check_token_ids(model, question_ids, "question_ids")
    return decode_batch(
        model,
        compressed,
        question_ids,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        rule=rule,
        decoding=decoding,
        **generate_kwargs,
    )[0]


@torch.no_grad()
def decode_batch(
    model: PreTrainedModel,
    compressed: CompressedCache,
    question_ids: torch.Tensor | None = None,
    question_mask: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
    decoding: Any = None,
    **generate_kwargs: Any,
) -> list[Generation]:
    """:func:`decode` for every row of ``compressed``, in one ``model.generate`` call: one
    :class:`Generation` per row, each ending at its own first ``eos_token_id`` (``decoding``:
    each row compressed on its own schedule while it is generated).

    ``question_ids`` (b, q), left-padded with ``question_mask`` (b, q) when the questions differ
    in length, are fed after the compressed contexts (query-agnostic); each row needs at least
    one question token. To ask some rows only, decode from ``compressed.rows(indices)``.
    """
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    b = compressed.batch_size
    ids, mask = compressed.prompt_ids, compressed.attention_mask
    if question_ids is not None:
        lengths = check_batch(model, question_ids, question_mask, "question_ids")
        if question_ids.shape[0] != b:
            raise ValueError(f"question_ids has {question_ids.shape[0]} rows; the compressed cache holds {b}")
        question_mask = torch.ones_like(question_ids) if question_mask is None else question_mask.long()
        ids = torch.cat([ids, question_ids.to(ids.device)], 1)
        mask = torch.cat([mask, question_mask.to(mask.device)], 1)
        fed = [n + q for n, q in zip(compressed.lengths, lengths, strict=True)]
    elif ids.shape[1] == compressed.start:
        raise ValueError("nothing to decode from: a query-agnostic cache needs question_ids")
    else:
        fed = list(compressed.lengths)
    check_rows_context(model, fed, max_new_tokens, "answer")
    prepare(model)
    start = now(ids.device)
    state = compressed.fork() if decoding is None else decoding.attach(model, compressed)
    return _generate(
        model, ids, mask, state, max_new_tokens, eos_token_id, rule, compressed.row_stats, start, generate_kwargs
    )


def _generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: CompressedCache | DynamicCache | None,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None,
    rule: TokenRule | None,
    stats: tuple[CompressionStats, ...],
    start: float,
    options: dict[str, Any],
) -> list[Generation]:
    """``model.generate(input_ids, attention_mask=..., cache=cache, ...)`` (b, m) -> each row's new
    tokens (up to its first eos) and first logits.

    As any ``generate`` call, decoding follows the model's ``generation_config`` (a repetition
    penalty it sets applies to every method alike), except that it is greedy unless ``do_sample``
    or a ``generation_config`` says otherwise, and stops at ``eos_token_id`` only.
    """
    check_generate_options(model, options)
    options = dict(options)
    if "do_sample" not in options and "generation_config" not in options:
        options["do_sample"] = False
    processors = LogitsProcessorList(options.pop("logits_processor", None) or [])
    if rule is not None:
        processors.append(RuleProcessor(rule))
    if eos_token_id is None or eos_token_id == []:  # empty, not None: the model's generation config adds none
        options.update(eos_token_id=[], pad_token_id=options.get("pad_token_id", 0))
        stops = torch.tensor([], dtype=torch.long)
    else:
        options["eos_token_id"] = eos_token_id
        stops = torch.as_tensor(eos_token_id).reshape(-1)
    if cache is not None:
        options["cache"] = cache
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,  # else a prompt token equal to the pad id reads as padding
        max_new_tokens=max_new_tokens,
        logits_processor=processors,
        return_dict_in_generate=True,
        output_logits=True,
        **options,
    )
    seconds = time.perf_counter() - start
    new = out.sequences[:, input_ids.shape[1] :].cpu()
    answers = []
    for row in range(new.shape[0]):
        ended = torch.isin(new[row], stops).nonzero()
        tokens = new[row] if not len(ended) else new[row, : int(ended[0]) + 1]
        answers.append(Generation(tokens, out.logits[0][row], stats[row] if stats else None, seconds))
    return answers


@torch.no_grad()
def continue_full(
    model: PreTrainedModel,
    cache: PositionedCache,
    feed: torch.Tensor,
    position: int,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
    prompt_ids: torch.Tensor | None = None,
    **generate_kwargs: Any,
) -> Generation:
    """The full-cache baseline from an existing prefill: ``model.generate`` feeding ``feed`` (1, q)
    at ``position`` (the count of tokens ``cache`` holds), then decoding; ``cache`` itself is
    left intact.

    The evaluation grid answers with the full cache from the prefill it shares with the
    compressed methods (query-aware: the cache of the first n - 1 tokens, the last one fed).
    ``prompt_ids`` (1, position): the cached tokens, for generate options that read the prompt
    (``repetition_penalty``, ``no_repeat_ngram_size``); without them ``generate`` sees
    placeholder ids there, which greedy decoding (the default) never reads.
    """
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    check_token_ids(model, feed, "feed")
    check_context(model, position, feed.shape[1] + max_new_tokens, "question/answer")
    if prompt_ids is None:
        prompt_ids = feed.new_zeros(1, position)
    if tuple(prompt_ids.shape) != (1, position):
        raise ValueError(
            f"prompt_ids must have shape (1, {position}) (the cached tokens), got {tuple(prompt_ids.shape)}"
        )
    prepare(model)
    start = now(feed.device)
    state = CompressedCache(cache.copy(), prompt_ids, position)
    ids = torch.cat([prompt_ids, feed], 1)
    mask = torch.ones_like(ids)
    return _generate(model, ids, mask, state, max_new_tokens, eos_token_id, rule, (), start, generate_kwargs)[0]


@torch.no_grad()
def generate_full(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
    decoding: Any = None,
    **generate_kwargs: Any,
) -> Generation:
    """The full-cache baseline: ``model.generate`` on ``input_ids`` (1, n) with transformers' own
    cache, nothing evicted; with ``decoding`` (a :class:`lorekv.schedule.DecodingSchedule`), the
    prompt prefilled whole and then compressed with the answer as the schedule says."""
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    check_token_ids(model, input_ids, "input_ids")
    check_context(model, input_ids.shape[1], max_new_tokens)
    return generate_full_batch(
        model, input_ids, None, max_new_tokens, eos_token_id=eos_token_id, rule=rule, decoding=decoding,
        **generate_kwargs,
    )[0]  # fmt: skip


@torch.no_grad()
def generate_full_batch(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
    decoding: Any = None,
    cache: CompressedCache | DynamicCache | None = None,
    **generate_kwargs: Any,
) -> list[Generation]:
    """:func:`generate_full` for ``input_ids`` (b, n), left-padded with ``attention_mask`` (b, n)
    when the prompts differ in length: one :class:`Generation` per row, each ending at its own
    first ``eos_token_id``; with ``decoding``, each row compressed on its own schedule. ``cache``:
    an empty cache to generate into, to read what it holds afterwards: transformers' own
    (:func:`full_cache`, :func:`cache_bytes`) or a schedule's (``decoding.cache(model, b)``, its
    ``bound``); None: generate's own, or ``decoding``'s."""
    if cache is not None and (decoding is not None or cache.get_seq_length() > 0):
        raise ValueError("cache must be an empty cache, and is not given with decoding (which makes its own)")
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    lengths = check_batch(model, input_ids, attention_mask, "input_ids")
    check_rows_context(model, lengths, max_new_tokens, "answer")
    prepare(model)
    start = now(input_ids.device)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    if decoding is not None:
        cache = decoding.cache(model, input_ids.shape[0])
    return _generate(model, input_ids, mask, cache, max_new_tokens, eos_token_id, rule, (), start, generate_kwargs)


def full_cache(model: PreTrainedModel) -> DynamicCache:
    """transformers' own cache for ``model``, which grows with every token (the baseline)."""
    return DynamicCache(config=model.config)


def cache_bytes(cache: DynamicCache) -> int:
    """Key/value bytes a transformers cache holds (every layer)."""
    return sum(
        layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
        for layer in cache.layers
        if getattr(layer, "keys", None) is not None and layer.keys.numel()
    )


def full_cache_bytes(model: PreTrainedModel, tokens: int) -> int:
    """Key/value bytes transformers' cache holds for one row of ``tokens`` tokens: all of them
    in a full-attention layer, the newest ``window - 1`` in a sliding-window one (what
    :func:`cache_bytes` reads from a :func:`full_cache` that was fed them)."""
    check_int_at_least("tokens", tokens, 0)
    config = text_config(model.config)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    size = next(model.parameters()).element_size()
    held = [tokens if window is None else min(tokens, window - 1) for window in layer_windows(model.config)]
    return 2 * kv_heads * head_dim * size * sum(held)
