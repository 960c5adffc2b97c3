"""Variable tracking (RULER's multi-hop tracing task, https://arxiv.org/abs/2404.06654).

A chain starts with ``VAR ABCDE = 12345.`` and continues with ``num_hops`` assignments
``VAR FGHIJ = VAR ABCDE.``, each naming the previous variable; ``num_chains`` such chains, each
with its own 5-digit value, are spread in order through RULER's noise haystack. The question
asks which variables hold the first chain's value: every name of that chain (metric ``all``),
which needs following the chain hop by hop.
"""

from __future__ import annotations

import random
import string
from typing import Literal

from pydantic import ValidationInfo, field_validator

from lorekv.eval.tasks.base import TASKS, Content, TaskConfig, TaskFamily
from lorekv.eval.tasks.words import NOISE, insert_at_depths, noise_sentences
from lorekv.validation import check_int_at_least

INTRO = "The text below hides chains of variable assignments. Track every chain: you will be asked about them."
_FORBIDDEN = (" ".join(NOISE) + " " + INTRO).lower()


class VariableTrackingConfig(TaskConfig):
    """Attributes:
    num_chains: chains of assignments, the first one asked about, the others distractors (>= 1).
    num_hops: assignments from one variable to the next in each chain (>= 1), so a chain
        names ``num_hops + 1`` variables.
    """

    name: Literal["variable_tracking"] = "variable_tracking"
    num_chains: int = 1
    num_hops: int = 4

    @field_validator("num_chains", "num_hops")
    @classmethod
    def _check_counts(cls, value: int, info: ValidationInfo) -> int:
        return check_int_at_least(info.field_name, value, 1)


def variable_names(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct names of 5 capital letters, none of them a word of the haystack or the
    instructions (the metric matches case-insensitively)."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in names and name.lower() not in _FORBIDDEN:
            names.append(name)
    return names


@TASKS.register(VariableTrackingConfig)
class VariableTracking(TaskFamily):
    """Chains of variable assignments in noise; the answer is the first chain's variables."""

    config: VariableTrackingConfig
    unit_tokens = 6.0

    def __init__(self, config: VariableTrackingConfig) -> None:
        super().__init__(config)
        self.max_new_tokens = max(32, 8 + 5 * (config.num_hops + 1))

    def check_fits(self, length: int) -> None:
        statements = self.config.num_chains * (self.config.num_hops + 1)
        self.refuse(
            length, 120 + 10 * statements, f"num_chains={self.config.num_chains}, num_hops={self.config.num_hops}"
        )

    def draw(self, seed: int, size: int, length: int) -> Content:
        rng = random.Random(seed)
        chains: list[list[str]] = []
        names = variable_names(rng, self.config.num_chains * (self.config.num_hops + 1))
        values = [str(v) for v in rng.sample(range(10_000, 100_000), self.config.num_chains)]
        items: list[str] = []
        depths: list[float] = []
        for c, value in enumerate(values):
            chain = names[c * (self.config.num_hops + 1) : (c + 1) * (self.config.num_hops + 1)]
            chains.append(chain)
            items.append(f"VAR {chain[0]} = {value}.")
            items.extend(f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:], strict=False))
            depths.extend(sorted(rng.random() for _ in chain))
        # Items of one chain keep their order: sorted depths, and ties keep the insertion order.
        text = " ".join(insert_at_depths(noise_sentences(size), items, depths))
        value, chain = values[0], chains[0]
        question = (
            f"Which variables are assigned the value {value}, directly or through other variables, in the text above?"
        )
        prefix = (
            f"Answer: following the chains of assignments, the {len(chain)} variables assigned the value {value} are:"
        )
        return Content(f"{INTRO}\n\n{text}", question, prefix, tuple(chain))
