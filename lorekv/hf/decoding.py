"""Decoding after compression, and the full-cache baseline.

Decoding always continues at the original positions: the next token after an n-token
prompt sits at position n whatever the compressed length, and keys keep their RoPE.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lorekv import token_rules
from lorekv.hf.attention import forward, prepare
from lorekv.hf.cache import PositionedCache
from lorekv.hf.compressed import CompressedCache, CompressionStats
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


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    compressed: CompressedCache,
    question_ids: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
) -> Generation:
    """Feed the pending prompt token(s) and ``question_ids`` (1, q), then decode.

    Decodes from a fork, so one compressed cache can answer several questions.
    """
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    if question_ids is not None:
        check_token_ids(model, question_ids, "question_ids")
    feed = compressed.pending_ids if question_ids is None else torch.cat([compressed.pending_ids, question_ids], 1)
    if feed.shape[1] == 0:
        raise ValueError("nothing to decode from: a query-agnostic cache needs question_ids")
    check_context(model, compressed.next_position, feed.shape[1] + max_new_tokens, "question/answer")
    prepare(model)
    start = now(feed.device)
    state = compressed.fork()
    return _decode_from(
        model, state.cache, feed, state.next_position, max_new_tokens, eos_token_id, rule, compressed.stats, start
    )


def _decode_from(
    model: PreTrainedModel,
    cache: PositionedCache,
    feed: torch.Tensor,
    position: int,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None,
    rule: TokenRule | None,
    stats: CompressionStats | None,
    start: float,
) -> Generation:
    """Feed ``feed`` (1, q) at ``position``.., then decode; the only host read per step is the
    end-of-sequence test (none without ``eos_token_id``)."""
    rule = rule or token_rules.greedy
    device = feed.device
    eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    positions = torch.arange(position, position + feed.shape[1] + max_new_tokens, device=device)
    logits = forward(model, feed, cache, positions[: feed.shape[1]])[:, -1]
    positions = positions[feed.shape[1] :]
    cache.reserve(1, max_new_tokens)
    first_logits = logits[0]
    out = torch.empty(max_new_tokens, dtype=torch.long, device=device)
    length = max_new_tokens
    for step in range(max_new_tokens):
        token = rule(logits)
        out[step] = token[0]
        if step + 1 == max_new_tokens:
            break
        if eos_ids and bool(torch.isin(token[0], eos)):
            length = step + 1
            break
        logits = forward(model, token.view(1, 1), cache, positions[step : step + 1])[:, -1]
    return Generation(out[:length].cpu(), first_logits, stats, time.perf_counter() - start)


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
) -> Generation:
    """The full-cache baseline from an existing prefill: feed ``feed`` (1, q) at ``position``
    (the count of tokens ``cache`` holds), then decode; ``cache`` itself is left intact.

    The evaluation grid answers with the full cache from the prefill it shares with the
    compressed methods (query-aware: the cache of the first n - 1 tokens, the last one fed).
    """
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    check_token_ids(model, feed, "feed")
    check_context(model, position, feed.shape[1] + max_new_tokens, "question/answer")
    prepare(model)
    start = now(feed.device)
    return _decode_from(model, cache.copy(), feed, position, max_new_tokens, eos_token_id, rule, None, start)


@torch.no_grad()
def generate_full(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    max_new_tokens: int = 32,
    *,
    eos_token_id: int | list[int] | None = None,
    rule: TokenRule | None = None,
) -> Generation:
    """The full-cache baseline: prefill ``input_ids`` (1, n) and decode, nothing evicted."""
    check_int_at_least("max_new_tokens", max_new_tokens, 1)
    check_token_ids(model, input_ids, "input_ids")
    check_context(model, input_ids.shape[1], max_new_tokens)
    prepare(model)
    start = now(input_ids.device)
    cache = PositionedCache.for_model(model.config)
    return _decode_from(model, cache, input_ids, 0, max_new_tokens, eos_token_id, rule, None, start)
