"""Question answering over the reference manual's prose: fill the blanks of quoted sentences.

RULER (https://arxiv.org/abs/2404.06654) hides the gold paragraph of a SQuAD or HotpotQA
question among distractor paragraphs. Those data sets are not bundled, so this family builds
its questions from the prose that ships with Python (``pydoc_data``), honestly and
deterministically:

1. ``num_facts`` sentences are drawn from the reference manual (distinct texts, 60 to 200
   characters). In each, one word is blanked: among its lowercase words of 5+ letters that
   occur once in the sentence and are not function words, the rarest in the whole manual (so
   the blank cannot be guessed from common phrasing).
2. The facts are placed at seeded random depths in a haystack of other manual prose.
3. The question quotes every fact with its word replaced by ``____`` and asks for the missing
   words; the gold answers are those words (metric ``all``: every blank must be filled).

The model has to find each quoted sentence in a long, same-style passage and compose the list
of missing words; each gold word appears in the context, in its sentence.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import cache
from typing import Literal

from pydantic import field_validator

from lorekv.eval.tasks.base import TASKS, Content, TaskConfig, TaskFamily
from lorekv.eval.tasks.haystack import haystack_sentences
from lorekv.eval.tasks.words import FUNCTION_WORDS, insert_at_depths, prose_sentences
from lorekv.validation import check_int_at_least

BLANK = "____"


class QAConfig(TaskConfig):
    """Attributes:
    num_facts: quoted sentences whose missing word must be given (1 to 5).
    """

    name: Literal["qa"] = "qa"
    num_facts: int = 2

    @field_validator("num_facts")
    @classmethod
    def _check_facts(cls, value: int) -> int:
        check_int_at_least("num_facts", value, 1)
        if value > 5:
            raise ValueError(f"num_facts must lie in [1, 5], got {value!r}")
        return value


@cache
def _word_counts() -> Counter[str]:
    return Counter(w for s in haystack_sentences() for w in re.findall(r"[a-z]+", s))


@cache
def facts() -> tuple[tuple[str, str], ...]:
    """(sentence, blanked word) for every usable reference-manual sentence, in pool order."""
    counts = _word_counts()
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for sentence in haystack_sentences():
        if sentence in seen or not 60 <= len(sentence) <= 200:
            continue
        seen.add(sentence)
        words = re.findall(r"(?<![\w.-])[a-z]{5,}(?![\w-])", sentence)
        candidates = [w for w in words if w not in FUNCTION_WORDS and words.count(w) == 1]
        if candidates:
            out.append((sentence, min(candidates, key=lambda w: (counts[w], w))))
    return tuple(out)


def blanked(sentence: str, word: str) -> str:
    return re.sub(rf"(?<![\w.-]){word}(?![\w-])", BLANK, sentence, count=1)


@TASKS.register(QAConfig)
class QA(TaskFamily):
    """Quoted manual sentences with a word blanked; the answer is the missing words."""

    config: QAConfig
    unit_tokens = 1.6

    def __init__(self, config: QAConfig) -> None:
        super().__init__(config)
        self.max_new_tokens = max(32, 8 + 8 * config.num_facts)

    def check_fits(self, length: int) -> None:
        self.refuse(length, 100 + 110 * self.config.num_facts, f"num_facts={self.config.num_facts}")

    def draw(self, seed: int, size: int, length: int) -> Content:
        rng = random.Random(seed)
        chosen = rng.sample(facts(), self.config.num_facts)
        # Distinct blank words, so that each answer names one blank.
        while len({w for _, w in chosen}) < len(chosen):
            chosen = rng.sample(facts(), self.config.num_facts)
        depths = [rng.random() for _ in chosen]
        units = prose_sentences(rng.randrange(len(haystack_sentences())), size)
        text = " ".join(insert_at_depths(units, [s for s, _ in chosen], depths))
        intro = "Read the passage below, taken from the Python reference manual, and answer the question after it."
        quoted = "\n".join(f"{i}. {blanked(s, w)}" for i, (s, w) in enumerate(chosen, start=1))
        question = (
            f"Each sentence below is quoted from the passage above with one word replaced by {BLANK}. "
            f"Give the missing word of each sentence, in order.\n{quoted}"
        )
        prefix = "Answer: the missing words are:"
        return Content(f"{intro}\n\n{text}", question, prefix, tuple(w for _, w in chosen))
