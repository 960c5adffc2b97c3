"""Prompts of exactly n tokens: a needle task's chat prompt with its haystack cut to fit; ragged
left-padded batches of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lorekv.eval.tasks import make_sample
from lorekv.eval.tasks.base import MIN_LENGTH
from lorekv.hf import left_pad

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def prompt_of_length(tokenizer: PreTrainedTokenizerBase, n: int, seed: int = 0) -> torch.Tensor:
    """(1, n) a query-aware ``niah_single`` prompt (chat template, haystack, question, answer prefix).

    The sample is drawn a little longer than needed and its context cut at its end, so the
    prompt keeps its head and its whole question; when the question alone would take more than
    half of n (tiny n), the prompt is the first n tokens of the whole one instead.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"length must be an integer >= 1, got {n!r}")
    size = max(MIN_LENGTH, n + 32)
    for _ in range(10):
        sample = make_sample("niah_single", tokenizer, size, seed=seed)
        context, question = sample.context_and_question_ids(tokenizer)
        missing = n - (context.shape[1] + question.shape[1])
        if missing <= 0:
            break
        size += missing + 32
    else:
        raise ValueError(f"could not build a prompt of {n} tokens from the haystack")
    q = question.shape[1]
    if q <= n // 2:
        ids = torch.cat([context[:, : n - q], question], dim=1)
    else:
        ids = torch.cat([context, question], dim=1)[:, :n]
    assert ids.shape == (1, n), ids.shape
    return ids


def batch_lengths(n: int, b: int) -> tuple[int, ...]:
    """The prompt lengths of a batch of ``b`` at length ``n``: row i has n - (i mod 8) * (n // 16)
    tokens (n, 15n/16, ..., 9n/16, then again), so row 0 is the batch-1 prompt and the rows are ragged."""
    return tuple(n - (i % 8) * (n // 16) for i in range(b))


def prompt_batch(
    tokenizer: PreTrainedTokenizerBase, n: int, b: int, seed: int = 0, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, n) left-padded ``input_ids`` and their (b, n) ``attention_mask``: row i is
    :func:`prompt_of_length` at :func:`batch_lengths` ``(n, b)[i]`` with seed ``seed + i`` (its own
    haystack and needle), padded on the left with ``pad_id``."""
    return left_pad(
        [prompt_of_length(tokenizer, length, seed + i) for i, length in enumerate(batch_lengths(n, b))], pad_id
    )
