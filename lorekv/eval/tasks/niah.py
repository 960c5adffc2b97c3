"""Needle-in-a-haystack families after RULER (https://arxiv.org/abs/2404.06654).

A needle is a sentence "The special magic <kind> for <key> is: <value>." hidden in a haystack,
either RULER's "repeat" noise (five fixed sentences over and over: ``haystack="noise"``) or
prose of the Python reference manual cut to the word (RULER uses essays: ``haystack="prose"``).
Keys and values are 7-digit numbers, adjective-noun words or uuid4 strings, all distinct within
a sample. Each needle sits at a seeded uniformly random depth.

- ``niah_single``: one needle, one question.
- ``niah_multikey``: the target needle among ``num_distractors`` needles with other keys (RULER's
  niah_multikey_1), or a haystack made only of distractor needles (``haystack="needles"``,
  RULER's niah_multikey_2/3).
- ``niah_multivalue``: one key with ``num_values`` values in separate needles; all are asked for.
- ``niah_multiquery``: ``num_queries`` keys asked at once; all their values are asked for.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import field_validator, model_validator

from lorekv.eval.tasks.base import TASKS, Content, TaskConfig, TaskFamily
from lorekv.eval.tasks.haystack import haystack_sentences
from lorekv.eval.tasks.words import Kind, draw_distinct, insert_at_depths, noise_sentences, prose_sentences
from lorekv.validation import check_int_at_least

VALUE_TOKENS = {"number": 8, "word": 8, "uuid": 30}
"""Generous tokens per generated key or value, to size ``max_new_tokens`` and minimum lengths."""


class NiahConfig(TaskConfig):
    """Options shared by the needle families.

    Attributes:
        haystack: ``"prose"`` (reference-manual sentences) or ``"noise"`` (RULER's repeated sentences).
        key: the kind of the needles' keys: ``"word"``, ``"number"`` or ``"uuid"``.
        value: the kind of the needles' values.
    """

    haystack: Literal["prose", "noise"] = "prose"
    key: Kind = "word"
    value: Kind = "number"


class NiahSingleConfig(NiahConfig):
    name: Literal["niah_single"] = "niah_single"


class NiahMultiKeyConfig(NiahConfig):
    """Attributes:
    haystack: also ``"needles"``: the haystack is made only of distractor needles (as many
        as fit), and ``num_distractors`` must be left at its default.
    num_distractors: needles with other keys besides the target (>= 1).
    """

    name: Literal["niah_multikey"] = "niah_multikey"
    haystack: Literal["prose", "noise", "needles"] = "prose"  # type: ignore[assignment]
    num_distractors: int = 3

    @field_validator("num_distractors")
    @classmethod
    def _check_distractors(cls, value: int) -> int:
        return check_int_at_least("num_distractors", value, 1)

    @model_validator(mode="after")
    def _check_needles(self) -> NiahMultiKeyConfig:
        if self.haystack == "needles" and self.num_distractors != 3:
            raise ValueError("num_distractors is unused with haystack='needles' (the haystack is all distractors)")
        return self


class NiahMultiValueConfig(NiahConfig):
    """Attributes:
    num_values: values of the one key, each in its own needle (>= 2).
    """

    name: Literal["niah_multivalue"] = "niah_multivalue"
    num_values: int = 4

    @field_validator("num_values")
    @classmethod
    def _check_values(cls, value: int) -> int:
        return check_int_at_least("num_values", value, 2)


class NiahMultiQueryConfig(NiahConfig):
    """Attributes:
    num_queries: keys asked about at once, each with one value (>= 2).
    """

    name: Literal["niah_multiquery"] = "niah_multiquery"
    num_queries: int = 4

    @field_validator("num_queries")
    @classmethod
    def _check_queries(cls, value: int) -> int:
        return check_int_at_least("num_queries", value, 2)


def needle(kind: str, key: str, value: str) -> str:
    return f"The special magic {kind} for {key} is: {value}."


def listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


class _Niah(TaskFamily):
    """Common drawing: needles (key, value) placed at random depths in the haystack."""

    config: NiahConfig

    def __init__(self, config: NiahConfig) -> None:
        super().__init__(config)
        self.unit_tokens = 1.6 if config.haystack == "prose" else 6.0
        self.needle_tokens = 12 + VALUE_TOKENS[config.key] + VALUE_TOKENS[config.value]
        self.max_new_tokens = 8 + self.num_answers() * VALUE_TOKENS[config.value]

    def num_answers(self) -> int:
        return 1

    def num_needles(self) -> int:
        return 1

    def check_fits(self, length: int) -> None:
        fields = [f for f in ("num_distractors", "num_values", "num_queries") if hasattr(self.config, f)]
        shown = ", ".join(f"{f}={getattr(self.config, f)}" for f in fields) or "one needle"
        self.refuse(
            length,
            120 + self.num_needles() * self.needle_tokens,
            f"{shown} (key={self.config.key}, value={self.config.value})",
        )

    def needles(self, rng: random.Random, used: set[str]) -> tuple[list[str], list[str], list[str]]:
        """(needle sentences, the keys asked about, gold answers), with every key and value added to ``used``."""
        raise NotImplementedError

    def question(self, keys: list[str]) -> tuple[str, str]:
        kind = self.config.value
        if self.num_answers() == 1:
            return (
                f"What is the special magic {kind} for {keys[0]} mentioned in the text above?",
                f"The special magic {kind} for {keys[0]} mentioned in the text is",
            )
        return (
            f"What are all the special magic {kind}s for {listed(keys)} mentioned in the text above?",
            f"The special magic {kind}s for {listed(keys)} mentioned in the text are",
        )

    def haystack(self, rng: random.Random, size: int, used: set[str]) -> list[str]:
        if self.config.haystack == "noise":
            return noise_sentences(size)
        return prose_sentences(rng.randrange(len(haystack_sentences())), size)

    def draw(self, seed: int, size: int, length: int) -> Content:
        rng = random.Random(seed)
        used: set[str] = set()
        items, keys, answers = self.needles(rng, used)
        depths = [rng.random() for _ in items]
        units = self.haystack(rng, size, used)
        text = " ".join(insert_at_depths(units, items, depths))
        kind = self.config.value
        intro = f"Some special magic {kind}s are hidden in the text below. Memorize them: you will be asked about them."
        question, prefix = self.question(keys)
        return Content(f"{intro}\n\n{text}", question, prefix, tuple(answers))


@TASKS.register(NiahSingleConfig)
class NiahSingle(_Niah):
    """One needle; the question asks for its value."""

    def needles(self, rng: random.Random, used: set[str]) -> tuple[list[str], list[str], list[str]]:
        (key,) = draw_distinct(rng, self.config.key, 1, used)
        (value,) = draw_distinct(rng, self.config.value, 1, used)
        return [needle(self.config.value, key, value)], [key], [value]


@TASKS.register(NiahMultiKeyConfig)
class NiahMultiKey(_Niah):
    """The target needle among distractor needles with other keys (and other values)."""

    config: NiahMultiKeyConfig

    def __init__(self, config: NiahMultiKeyConfig) -> None:
        super().__init__(config)
        if config.haystack == "needles":
            self.unit_tokens = float(self.needle_tokens)

    def num_needles(self) -> int:
        return 1 if self.config.haystack == "needles" else 1 + self.config.num_distractors

    def needles(self, rng: random.Random, used: set[str]) -> tuple[list[str], list[str], list[str]]:
        count = 1 if self.config.haystack == "needles" else 1 + self.config.num_distractors
        keys = draw_distinct(rng, self.config.key, count, used)
        values = draw_distinct(rng, self.config.value, count, used)
        return [needle(self.config.value, k, v) for k, v in zip(keys, values, strict=True)], keys[:1], values[:1]

    def haystack(self, rng: random.Random, size: int, used: set[str]) -> list[str]:
        if self.config.haystack != "needles":
            return super().haystack(rng, size, used)
        keys = draw_distinct(rng, self.config.key, size, used)
        values = draw_distinct(rng, self.config.value, size, used)
        return [needle(self.config.value, k, v) for k, v in zip(keys, values, strict=True)]


@TASKS.register(NiahMultiValueConfig)
class NiahMultiValue(_Niah):
    """One key with several values, each in its own needle; all values are asked for."""

    config: NiahMultiValueConfig

    def num_answers(self) -> int:
        return self.config.num_values

    def num_needles(self) -> int:
        return self.config.num_values

    def needles(self, rng: random.Random, used: set[str]) -> tuple[list[str], list[str], list[str]]:
        (key,) = draw_distinct(rng, self.config.key, 1, used)
        values = draw_distinct(rng, self.config.value, self.config.num_values, used)
        return [needle(self.config.value, key, v) for v in values], [key], values


@TASKS.register(NiahMultiQueryConfig)
class NiahMultiQuery(_Niah):
    """Several keys, one needle each, asked about at once; all values are asked for."""

    config: NiahMultiQueryConfig

    def num_answers(self) -> int:
        return self.config.num_queries

    def num_needles(self) -> int:
        return self.config.num_queries

    def needles(self, rng: random.Random, used: set[str]) -> tuple[list[str], list[str], list[str]]:
        keys = draw_distinct(rng, self.config.key, self.config.num_queries, used)
        values = draw_distinct(rng, self.config.value, self.config.num_queries, used)
        return [needle(self.config.value, k, v) for k, v in zip(keys, values, strict=True)], keys, values
