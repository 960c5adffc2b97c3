"""Frequent words extraction (RULER's aggregation task "fwe", https://arxiv.org/abs/2404.06654).

A "coded text" of made-up words (all of the form consonant-vowel-consonant-vowel-consonant, so
none is part of another) whose frequencies follow Zipf's law with exponent ``alpha``; the model
is asked for the ``num_answers`` most frequent (metric ``all``). Where RULER samples the words
from a Zipf distribution, the counts here are the law's expected counts, rounded down: the
word of rank r occurs ``floor(size / r**alpha)`` times (``size`` grows with the length), in a
seeded random order. That keeps the gold words strictly the most frequent at every length.
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import field_validator

from lorekv.eval.tasks.base import TASKS, Content, TaskConfig, TaskFamily
from lorekv.eval.tasks.words import made_up_words
from lorekv.validation import check_in_range, check_int_at_least

WORD_TOKENS = 2
"""Fewest tokens one made-up word takes with common tokenizers, for the early check."""


class FrequentWordsConfig(TaskConfig):
    """Attributes:
    alpha: Zipf exponent in [1.1, 10] (larger: the top words dominate more; RULER uses 2).
    num_answers: the most frequent words asked for (>= 1).
    """

    name: Literal["frequent_words"] = "frequent_words"
    alpha: float = 2.0
    num_answers: int = 3

    @field_validator("alpha")
    @classmethod
    def _check_alpha(cls, value: float) -> float:
        return check_in_range("alpha", value, 1.1, 10.0)

    @field_validator("num_answers")
    @classmethod
    def _check_answers(cls, value: int) -> int:
        return check_int_at_least("num_answers", value, 1)


def zipf_counts(size: int, alpha: float) -> list[int]:
    """Occurrences of the words by rank: ``floor(size / r**alpha)`` while at least 1."""
    counts = []
    rank = 1
    while (count := math.floor(size / rank**alpha)) >= 1:
        counts.append(count)
        rank += 1
    return counts


@TASKS.register(FrequentWordsConfig)
class FrequentWords(TaskFamily):
    """Zipf-distributed made-up words; the answer is the ``num_answers`` most frequent."""

    config: FrequentWordsConfig

    def __init__(self, config: FrequentWordsConfig) -> None:
        super().__init__(config)
        k = config.num_answers
        self.max_new_tokens = max(32, 8 + 6 * k)
        self.unit_tokens = WORD_TOKENS * sum(r**-config.alpha for r in range(1, 1000))
        # The smallest size whose top k + 1 counts are strictly decreasing.
        size = 1
        while len(c := zipf_counts(size, config.alpha)) <= k or any(c[i] <= c[i + 1] for i in range(k)):
            size += 1
        self.min_size = size

    def check_fits(self, length: int) -> None:
        needed = 100 + WORD_TOKENS * sum(zipf_counts(self.min_size, self.config.alpha))
        self.refuse(length, needed, f"num_answers={self.config.num_answers}, alpha={self.config.alpha}")

    def draw(self, seed: int, size: int, length: int) -> Content:
        rng = random.Random(seed)
        counts = zipf_counts(size, self.config.alpha)
        vocabulary = made_up_words(rng, len(counts))
        words = [w for w, c in zip(vocabulary, counts, strict=True) for _ in range(c)]
        rng.shuffle(words)
        k = self.config.num_answers
        intro = "Read the coded text below and keep count of how often each coded word occurs."
        question = f"What are the {k} most frequent coded words in the text above?"
        prefix = f"Answer: the {k} most frequent coded words in the text are:"
        return Content(f"{intro}\n\n{' '.join(words)}", question, prefix, tuple(vocabulary[:k]))
