"""List recall: write back, in order, a numbered list read from the context (a long-output task).

The context is a numbered list of distinct items (nouns, or adjective-noun phrases); the
question asks for the whole list again, in the same order, and the answer prefix starts it at
``1.``. The list grows with the length (its size is the item count), and so does the answer:
about as many tokens as the list, so a cache bounded while generating
(:class:`lorekv.schedule.DecodingSchedule`) must keep the items not yet written and know from
its own output where the list stands. Metric ``in_order``: the longest run of gold items the
prediction holds in the list's order, over the item count
(:func:`~lorekv.eval.tasks.metrics.string_match_in_order`).
"""

from __future__ import annotations

import random
from typing import Literal

from lorekv.eval.tasks.base import TASKS, Content, TaskConfig, TaskFamily
from lorekv.eval.tasks.words import ADJECTIVES, NOUNS

LINE_TOKENS = {"noun": 6, "phrase": 8}
"""Generous tokens per written line (``12. cedar`` and its line break), to size the answer."""


MAX_PHRASES = 4000
"""The longest list of phrases (distinct adjective-noun pairs): prompts of about 30K tokens."""


class ListRecallConfig(TaskConfig):
    """Attributes:
    item: ``"noun"`` (a distinct bundled noun an item: lists of up to 200, prompts of about 1K
        tokens) or ``"phrase"`` (a distinct adjective-noun pair: longer lists and prompts).
    """

    name: Literal["list_recall"] = "list_recall"
    item: Literal["noun", "phrase"] = "noun"


@TASKS.register(ListRecallConfig)
class ListRecall(TaskFamily):
    """A numbered list in the context, written back in order; the answer is every item."""

    config: ListRecallConfig
    metric = "in_order"
    min_size = 4

    def __init__(self, config: ListRecallConfig) -> None:
        super().__init__(config)
        self.unit_tokens = LINE_TOKENS[config.item] - 2.0

    def max_size(self, length: int) -> int:
        return len(NOUNS) if self.config.item == "noun" else MAX_PHRASES

    def draw(self, seed: int, size: int, length: int) -> Content:
        rng = random.Random(seed)
        if self.config.item == "noun":
            items = rng.sample(NOUNS, size)
        else:
            pairs = rng.sample(range(len(ADJECTIVES) * len(NOUNS)), size)
            items = [f"{ADJECTIVES[p // len(NOUNS)]} {NOUNS[p % len(NOUNS)]}" for p in pairs]
        listing = "\n".join(f"{k}. {item}" for k, item in enumerate(items, 1))
        context = f"Read this list of {size} items.\n\n{listing}"
        question = f"Write the list again, all {size} items in the same order."
        return Content(context, question, "1.", tuple(items), max_new_tokens=8 + LINE_TOKENS[self.config.item] * size)
