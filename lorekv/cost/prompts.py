"""Prompts of exactly n tokens: a needle task's chat prompt with its haystack cut to fit, or seeded
random token ids for a model without a tokenizer (random weights); ragged left-padded batches of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from lorekv.eval.tasks import make_sample
from lorekv.eval.tasks.base import MIN_LENGTH
from lorekv.hf import left_pad

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class Prompts(Protocol):
    """Where the benchmark's prompts come from: ``prompts(n, seed)`` is a (1, n) prompt."""

    kind: str
    pad_id: int

    def __call__(self, n: int, seed: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class TaskPrompts:
    """:func:`prompt_of_length` through a model's tokenizer: the needle task a real model reads."""

    tokenizer: PreTrainedTokenizerBase
    kind: str = "niah_single needle task (chat template)"

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def __call__(self, n: int, seed: int) -> torch.Tensor:
        return prompt_of_length(self.tokenizer, n, seed)


@dataclass(frozen=True)
class RandomPrompts:
    """Seeded uniform random token ids below ``vocab_size``: the prompts of a model without a tokenizer
    (random weights, where no text means anything and the cost depends on n alone)."""

    vocab_size: int
    kind: str = "random token ids (no tokenizer)"
    pad_id: int = 0

    def __call__(self, n: int, seed: int) -> torch.Tensor:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"length must be an integer >= 1, got {n!r}")
        return torch.randint(self.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def prompts_for(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> Prompts:
    """The needle task through ``tokenizer``; random token ids within the model's vocabulary without one."""
    if tokenizer is None:
        return RandomPrompts(model.get_input_embeddings().num_embeddings)
    return TaskPrompts(tokenizer)


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
    return batch_of(TaskPrompts(tokenizer), n, b, seed, pad_id)


def batch_of(
    prompts: Prompts, n: int, b: int, seed: int = 0, pad_id: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`prompt_batch` from any :class:`Prompts` (``pad_id`` default: the source's)."""
    rows = [prompts(length, seed + i) for i, length in enumerate(batch_lengths(n, b))]
    return left_pad(rows, prompts.pad_id if pad_id is None else pad_id)
