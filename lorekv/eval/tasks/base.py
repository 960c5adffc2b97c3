"""Task configs, their registry, and the length search that turns a config into a sample.

A task family (RULER, https://arxiv.org/abs/2404.06654) is a config class registered in
:data:`TASKS` with a :class:`TaskFamily` that draws its content. A family's content grows
with one integer, its *size* (haystack sentences or words, list entries, ...); the content of
a given size is drawn afresh from the per-sample seed, so it depends on (seed, size) only.
:func:`make_sample` then searches the largest size whose whole chat prompt fits in the
requested number of tokens, measured with the tokenizer itself (RULER does the same with a
binary search): an estimate of tokens per unit first, then interpolation inside a bracket.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from lorekv.eval.tasks.sample import Sample
from lorekv.registry import ComponentConfig, Registry
from lorekv.validation import check_int_at_least, describe

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MIN_LENGTH = 256
"""The shortest prompt, in tokens, any task is built for."""


class TaskConfig(ComponentConfig):
    """Base of every task config: a registry ``name`` and the family's options."""

    @property
    def label(self) -> str:
        """The name plus the options that differ from their defaults, in field order, e.g.
        ``niah_single[haystack=noise,value=uuid]``: a stable row key for results."""
        changed = [
            f"{field}={getattr(self, field)}"
            for field, info in type(self).model_fields.items()
            if field != "name" and getattr(self, field) != info.default
        ]
        return f"{self.name}[{','.join(changed)}]" if changed else self.name


@dataclass(frozen=True)
class Content:
    """What a family draws for one size: the sample without its bookkeeping fields."""

    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    max_new_tokens: int | None = None
    """The answer's token budget where it grows with the content (None: the family's)."""


class TaskFamily(ABC):
    """Draws a family's content; built from its config by :data:`TASKS`.

    Attributes (class defaults, which a family may set per config in ``__init__``):
        metric: the family's metric (``"all"``, ``"part"`` or ``"in_order"``).
        max_new_tokens: tokens to generate for an answer.
        min_size: the smallest size (content that must be there whatever the length).
        unit_tokens: a rough, generous count of tokens per unit of size, for the first guess
            and for the tokenizer-free minimum-length check.
    """

    metric: Literal["all", "part", "in_order"] = "all"
    max_new_tokens: int = 16
    min_size: int = 0
    unit_tokens: float = 6.0

    def __init__(self, config: TaskConfig) -> None:
        self.config = config

    def max_size(self, length: int) -> int | None:
        """The largest size the family can draw (a word list's size), or ``None`` for no limit."""
        return None

    def check_fits(self, length: int) -> None:
        """Raise a ValueError naming the task, the parameter and the minimum length when the
        config's fixed content clearly cannot fit in ``length`` tokens. A tokenizer-free,
        optimistic estimate checked before any work; the length search also fails clearly when
        the measured content does not fit."""
        self.refuse(length, MIN_LENGTH, "any task")

    def refuse(self, length: int, needed: int, parameters: str) -> None:
        """The check of :meth:`check_fits`: ``parameters`` (e.g. ``"num_values=8"``) need ``needed`` tokens."""
        if length < needed:
            raise ValueError(f"task {self.config.label}: {parameters} needs a length >= {needed} tokens, got {length}")

    @abstractmethod
    def draw(self, seed: int, size: int, length: int) -> Content:
        """The content of ``size`` units, drawn from a fresh generator seeded with ``seed``
        (``length``, the target prompt length, only selects length-dependent defaults)."""


TASKS: Registry[TaskFamily] = Registry("task")
"""Task families by name: ``TASKS.parse(spec)`` validates a config, ``TASKS.build(config)`` a family."""


def parse_task(spec: TaskConfig | Mapping[str, Any] | str) -> TaskConfig:
    """A validated task config from a config, a bare name, or a mapping with ``name`` and options.

    Raises:
        ValueError: one line naming the unknown task (and the known ones) or the bad option
            (and the family's options).
    """
    try:
        config = TASKS.parse(spec)
    except ValidationError as error:
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        options = [f for f in TASKS.config_class(str(name)).model_fields if f != "name"]
        raise ValueError(f"task {name}: {describe(error)}; options: {options}") from None
    assert isinstance(config, TaskConfig)
    return config


def sample_seed(seed: int, label: str, length: int, index: int) -> int:
    """A 64-bit seed for one sample, from a SHA-256 of its coordinates (stable across runs and
    Python processes, unlike :func:`hash`)."""
    digest = hashlib.sha256(f"{seed}|{label}|{length}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def check_length(length: int, config: TaskConfig | None = None) -> int:
    """``length`` (the prompt's token budget) checked before any work: an integer >= 256, and
    at least what ``config``'s content needs.

    Raises:
        ValueError: naming the task, the parameter and the minimum length.
    """
    check_int_at_least("length", length, MIN_LENGTH)
    if config is not None:
        config = parse_task(config)
        TASKS.build(config).check_fits(length)
    return length


def make_sample(
    config: TaskConfig | Mapping[str, Any] | str,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    index: int = 0,
    seed: int = 0,
) -> Sample:
    """The ``index``-th sample of ``config`` whose whole chat prompt has between ``0.9 * length``
    and ``length`` tokens.

    Deterministic: the same (config, length, index, seed) and tokenizer give the same sample.

    Raises:
        ValueError: a bad config, index or seed, a length under 256 or too short for the
            config's content, or a length the family's word lists cannot fill.
    """
    config = parse_task(config)
    check_length(length, config)
    check_int_at_least("index", index, 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    family = TASKS.build(config)
    label = config.label
    per_sample = sample_seed(seed, label, length, index)

    def build(size: int) -> Sample:
        content = family.draw(per_sample, size, length)
        return Sample(
            task=label,
            index=index,
            seed=seed,
            context=content.context,
            question=content.question,
            answer_prefix=content.answer_prefix,
            answers=content.answers,
            metric=family.metric,
            max_new_tokens=content.max_new_tokens or family.max_new_tokens,
        )

    return _fit(build, tokenizer, length, family, label)


def _fit(
    build: Callable[[int], Sample], tokenizer: PreTrainedTokenizerBase, length: int, family: TaskFamily, label: str
) -> Sample:
    """The sample of the largest size whose prompt fits in ``length`` tokens (see the module doc)."""
    measured: dict[int, tuple[int, Sample]] = {}

    def tokens(size: int) -> int:
        if size not in measured:
            sample = build(size)
            measured[size] = (sample.prompt_ids(tokenizer).shape[1], sample)
        return measured[size][0]

    lo = family.min_size
    base = tokens(lo)
    if base > length:
        raise ValueError(
            f"task {label}: length {length} is too short for its content, which needs at least {base} tokens "
            f"with this tokenizer; use a length >= {base}"
        )
    top = family.max_size(length)
    hi: int | None = None  # the smallest size known not to fit
    rate = family.unit_tokens  # tokens per unit, refined by every measurement
    target = 0.98 * length  # close enough: stop searching once the prompt is this long
    for _ in range(64):
        t_lo = tokens(lo)
        if t_lo >= target or (hi is not None and hi - lo <= 1) or (top is not None and lo >= top):
            break
        if hi is None:
            guess = lo + max(1, round((target - t_lo) / rate))
            guess = guess if top is None else min(guess, top)
        else:
            slope = (tokens(hi) - t_lo) / (hi - lo)
            guess = lo + round((target - t_lo) / slope) if slope > 0 else (lo + hi) // 2
            guess = min(max(guess, lo + 1), hi - 1)
        t = tokens(guess)
        if t <= length:
            rate = max((t - t_lo) / (guess - lo), 0.05)
            lo = guess
        else:
            hi = guess
    count, sample = measured[lo]
    if count < 0.9 * length:
        if top is not None and lo >= top:
            raise ValueError(
                f"task {label}: length {length} is too long for the bundled word lists "
                f"(at most {count} tokens with this tokenizer); use a shorter length"
            )
        raise RuntimeError(f"task {label}: the closest prompt has {count} tokens, under 0.9 * {length}")
    return sample
