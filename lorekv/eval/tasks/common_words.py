"""Common words extraction (RULER's aggregation task "cwe", https://arxiv.org/abs/2404.06654).

A numbered list of words ("1. river 2. quiet 3. river ...") where ``num_common`` words occur
``freq_common`` times each and every other word ``freq_uncommon`` times; the model is asked for
the ``num_common`` most common words (metric ``all``). The list grows with the length (more
uncommon words). As in RULER, the frequencies default to 30 and 3 for prompts of 4096 tokens
or more and to 6 and 1 below that (30 repetitions of 10 words would not fit a short prompt).
Words come from the bundled lists and the reference manual's prose, which bounds the length
(a ValueError says so).
"""

from __future__ import annotations

import random
from functools import cache
from typing import Literal

from pydantic import ValidationInfo, field_validator

from lorekv.eval.tasks.base import TASKS, Content, TaskConfig, TaskFamily
from lorekv.eval.tasks.words import common_word_vocabulary
from lorekv.validation import check_int_at_least

LONG = 4096
"""From this prompt length on, RULER's long-prompt frequencies (30 and 3) are the defaults."""

ENTRY_TOKENS = 3
"""Fewest tokens one list entry ("12. word") takes with common tokenizers, for the early check."""


class CommonWordsConfig(TaskConfig):
    """Attributes:
    num_common: words asked for, each occurring ``freq_common`` times (>= 1).
    freq_common: occurrences of each common word; ``None``: 30 from 4096 tokens on, else 6.
    freq_uncommon: occurrences of every other word (< ``freq_common``); ``None``: 3 from 4096
        tokens on, else 1.
    """

    name: Literal["common_words"] = "common_words"
    num_common: int = 10
    freq_common: int | None = None
    freq_uncommon: int | None = None

    @field_validator("num_common", "freq_common", "freq_uncommon")
    @classmethod
    def _check_counts(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else check_int_at_least(info.field_name, value, 1)

    def frequencies(self, length: int) -> tuple[int, int]:
        """(freq_common, freq_uncommon) for a prompt of ``length`` tokens, defaults resolved."""
        long = length >= LONG
        common = self.freq_common if self.freq_common is not None else (30 if long else 6)
        uncommon = self.freq_uncommon if self.freq_uncommon is not None else (3 if long else 1)
        if common <= uncommon:
            raise ValueError(
                f"task {self.label}: freq_common ({common}) must exceed freq_uncommon ({uncommon}) at length {length}"
            )
        return common, uncommon


@cache
def _others(common: tuple[str, ...]) -> tuple[str, ...]:
    """The vocabulary without the common words and without any word that contains one of them
    or is contained in one (so that finding a common word in an answer means that word)."""
    return tuple(w for w in common_word_vocabulary() if not any(c in w or w in c for c in common))


@TASKS.register(CommonWordsConfig)
class CommonWords(TaskFamily):
    """A numbered word list; the answer is its ``num_common`` most frequent words."""

    config: CommonWordsConfig
    unit_tokens = 4.0

    def __init__(self, config: CommonWordsConfig) -> None:
        super().__init__(config)
        self.max_new_tokens = max(64, 6 * config.num_common)

    def check_fits(self, length: int) -> None:
        common, _ = self.config.frequencies(length)
        vocabulary = len(common_word_vocabulary())
        if self.config.num_common > vocabulary // 2:
            raise ValueError(f"task {self.config.label}: num_common must be <= {vocabulary // 2}")
        needed = 100 + ENTRY_TOKENS * self.config.num_common * common
        self.refuse(length, needed, f"num_common={self.config.num_common} x freq_common={common}")

    def max_size(self, length: int) -> int | None:
        return len(common_word_vocabulary()) - self.config.num_common

    def draw(self, seed: int, size: int, length: int) -> Content:
        freq_common, freq_uncommon = self.config.frequencies(length)
        rng = random.Random(seed)
        common = tuple(rng.sample(common_word_vocabulary(), self.config.num_common))
        others = _others(common)
        uncommon = rng.sample(others, min(size, len(others)))
        words = list(common) * freq_common + uncommon * freq_uncommon
        rng.shuffle(words)
        listing = " ".join(f"{i}. {w}" for i, w in enumerate(words, start=1))
        n = self.config.num_common
        intro = (
            "Below is a numbered list of words. Some words occur many more times than the others: "
            "keep track of how often each word occurs."
        )
        question = f"What are the {n} most common words in the list above?"
        prefix = f"Answer: the {n} words that occur most often in the list are:"
        return Content(f"{intro}\n\n{listing}", question, prefix, common)
