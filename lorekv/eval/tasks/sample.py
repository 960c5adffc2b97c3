"""One long-context sample (drawn by a task family or read from a benchmark file), its prompt and its metric."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lorekv.eval.suites.metrics import metric
from lorekv.models.tokens import SPLIT, chat_text, encode, encode_split, leading_special_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PLAIN_SUFFIX = "\n"
"""What follows the question when the tokenizer has no chat template (before the answer prefix)."""


@dataclass(frozen=True)
class Sample:
    """One question over a long context, with its gold answers.

    Attributes:
        task: the task's label (its name and non-default options, e.g. ``niah_single[value=uuid]``).
        index: the sample's index within (task, length).
        seed: the seed it was drawn from (the per-sample seed is derived from it, see
            :func:`~lorekv.eval.tasks.base.sample_seed`).
        context: everything before the question: the instructions and the long text.
        question: what the model is asked, after the context.
        answer_prefix: the start of the assistant's turn, part of the prompt (RULER's templates
            do the same), so that the answer proper starts right away.
        answers: the gold answers.
        metric: the metric's name: ``"all"`` (every answer must be produced), ``"part"`` (any one
            suffices), or a suite's metric (:data:`lorekv.eval.suites.metrics.SUITE_METRICS`).
        max_new_tokens: how many tokens to generate for the answer.
        separator: the text between the context and the question.
        chat: wrap the prompt in the tokenizer's chat template (when it has one); otherwise the
            bare text, after the special tokens the tokenizer puts in front of any text (its BOS).
        plain_suffix: what follows the question when no chat template wraps it.
        classes: the label set of a classification metric.
        suite: the benchmark suite the sample comes from (None for a generated task).
        tags: what the suite's averages group by besides the task (``difficulty``, ``length``).
    """

    task: str
    index: int
    seed: int
    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    metric: str
    max_new_tokens: int
    separator: str = "\n\n"
    chat: bool = True
    plain_suffix: str = PLAIN_SUFFIX
    classes: tuple[str, ...] = ()
    suite: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def score(self, prediction: str) -> float:
        """The sample's metric of ``prediction`` against its gold answers, in [0, 1]."""
        return metric(self.metric)(prediction, self.answers, classes=self.classes)

    def prompt_text(self, tokenizer: PreTrainedTokenizerBase) -> str:
        """The whole prompt, answer prefix included, with :data:`SPLIT` where the context ends."""
        user = f"{self.context}{SPLIT}{self.separator}{self.question}"
        if self.chat and getattr(tokenizer, "chat_template", None):
            return chat_text(tokenizer, user) + self.answer_prefix
        return leading_special_text(tokenizer) + user + self.plain_suffix + self.answer_prefix

    def prompt_ids(self, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
        """(1, n) the whole chat prompt, question included (query-aware use)."""
        return encode(tokenizer, self.prompt_text(tokenizer))

    def context_and_question_ids(self, tokenizer: PreTrainedTokenizerBase) -> tuple[torch.Tensor, torch.Tensor]:
        """((1, c), (1, q)): the prompt split where the context ends (query-agnostic use);
        concatenated, they are exactly :meth:`prompt_ids`."""
        return encode_split(tokenizer, self.prompt_text(tokenizer))

    def answer_positions(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        """Sorted positions in :meth:`prompt_ids` of the tokens that overlap an occurrence
        (case-insensitive) of a gold answer in the context: the tokens a kept-token map should
        keep for the answer to stay retrievable."""
        text = self.prompt_text(tokenizer)
        cut = text.index(SPLIT)
        start = cut - len(self.context)
        if start < 0 or text[start:cut] != self.context:
            start = text.find(self.context)
            if start < 0:
                raise ValueError("the chat template changed the context: its answers cannot be located")
        spans = [
            (start + m.start(), start + m.end())
            for answer in self.answers
            for m in re.finditer(re.escape(answer), self.context, flags=re.IGNORECASE)
        ]
        encoded = tokenizer(text.replace(SPLIT, ""), add_special_tokens=False, return_offsets_mapping=True)
        shift = len(SPLIT)
        positions = []
        for i, (begin, end) in enumerate(encoded["offset_mapping"]):
            # Offsets are in the text without the marker, which lies after the context.
            begin, end = (begin + shift, end + shift) if begin >= cut else (begin, end)
            if end > begin and any(begin < b and a < end for a, b in spans):
                positions.append(i)
        return positions
