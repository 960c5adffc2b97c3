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
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lorekv.hf.attention import prepare
from lorekv.hf.cache import PositionedCache
from lorekv.hf.compressed import CompressedCache, CompressionStats
from lorekv.hf.generation import check_options
from lorekv.hf.inputs import check_context, check_token_ids
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
    **generate_kwargs: Any,
) -> Generation:
    """``model.generate`` from a fork of ``compressed``, fed the pending prompt token(s) and
    ``question_ids`` (1, q); ``compressed`` itself is left intact, so it can answer several
    questions.

    Greedy unless ``rule`` (a token rule, applied as a logits processor) or ``generate_kwargs``
    (``do_sample=True, temperature=...``, a streamer, ...) say otherwise; stops at
    ``eos_token_id`` only (None: runs to ``max_new_tokens``, whatever the model's generation
    config says).
    """
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    if question_ids is not None:
        check_token_ids(model, question_ids, "question_ids")
    ids = compressed.prompt_ids if question_ids is None else torch.cat([compressed.prompt_ids, question_ids], 1)
    if ids.shape[1] == compressed.start:
        raise ValueError("nothing to decode from: a query-agnostic cache needs question_ids")
    check_context(model, ids.shape[1], max_new_tokens, "answer")
    prepare(model)
    start = now(ids.device)
    state = compressed.fork()
    return _generate(model, ids, state, max_new_tokens, eos_token_id, rule, compressed.stats, start, generate_kwargs)


def _generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    cache: CompressedCache | None,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None,
    rule: TokenRule | None,
    stats: CompressionStats | None,
    start: float,
    options: dict[str, Any],
) -> Generation:
    """``model.generate(input_ids, cache=cache, ...)`` (1, m) -> the new tokens and first logits.

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
    else:
        options["eos_token_id"] = eos_token_id
    if cache is not None:
        options["cache"] = cache
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),  # else a prompt token equal to the pad id reads as padding
        max_new_tokens=max_new_tokens,
        logits_processor=processors,
        return_dict_in_generate=True,
        output_logits=True,
        **options,
    )
    tokens = out.sequences[0, input_ids.shape[1] :]
    return Generation(tokens.cpu(), out.logits[0][0], stats, time.perf_counter() - start)


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
    return _generate(model, ids, state, max_new_tokens, eos_token_id, rule, None, start, generate_kwargs)


@torch.no_grad()
def generate_full(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
    **generate_kwargs: Any,
) -> Generation:
    """The full-cache baseline: ``model.generate`` on ``input_ids`` (1, n) with transformers' own
    cache, nothing evicted."""
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    check_token_ids(model, input_ids, "input_ids")
    check_context(model, input_ids.shape[1], max_new_tokens)
    prepare(model)
    start = now(input_ids.device)
    return _generate(model, input_ids, None, max_new_tokens, eos_token_id, rule, None, start, generate_kwargs)
