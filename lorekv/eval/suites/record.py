"""What a benchmark file's row becomes: a :class:`Record` (one context, one or more questions),
and the :class:`SuiteFormat` base every suite's reader derives from.

A format knows its suite's row fields, prompt template, answer lengths, metric and chat rule;
the file task (:mod:`lorekv.eval.suites.task`) does the rest the same way for every suite:
filtering, limits, subsets, middle truncation and the harness's samples.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Turn:
    """One question on a record's context.

    Attributes:
        question: the prompt text after the context (the template's tail, the question filled in).
        answers: the gold answers (alternatives, or all required, as the metric says); at least one.
        answer_prefix: the start of the answer, part of the prompt after the chat template's
            generation prompt (RULER's ``answer_prefix``); empty where the template ends the prompt.
    """

    question: str
    answers: tuple[str, ...]
    answer_prefix: str = ""


@dataclass(frozen=True)
class Record:
    """One row of a benchmark file as the harness asks it: a context and its questions.

    Attributes:
        subtask: the suite's sub-task (a LongBench dataset, a RULER task, an InfiniteBench task).
        context: the prompt text before the question: the template's head and the long text.
        turns: the questions on this context (several for multi-turn rows, answered from one
            compression of the context in query-agnostic mode).
        separator: the text between the context and each question.
        metric: a metric name of :data:`lorekv.eval.suites.metrics.SUITE_METRICS` (or ``"all"``/``"part"``).
        max_new_tokens: the suite's answer length for this sub-task.
        chat: wrap the prompt in the tokenizer's chat template (LongBench leaves its few-shot
            and code datasets bare; RULER's files hold the template already).
        truncate: middle-truncate a prompt longer than the length (keep the head and the tail,
            LongBench's rule); without it a prompt over the length is an error.
        classes: the label set of a classification metric (LongBench's ``all_classes``).
        tags: what the suite averages by besides the sub-task (``difficulty``, ``length``).
    """

    subtask: str
    context: str
    turns: tuple[Turn, ...]
    metric: str
    max_new_tokens: int
    separator: str = ""
    chat: bool = True
    truncate: bool = True
    classes: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


class RowError(ValueError):
    """A row that does not fit its format; the reader adds the file and line."""


class SuiteFormat(ABC):
    """Reads one suite's rows.

    Class attributes:
        name: the format's name in a grid (``format: longbench``).
        suite: the suite its averages are reported under (``LongBench``).
        fields: the fields every row must have (checked before :meth:`parse`).
        subtasks: the sub-tasks the format knows (empty: any).
    """

    name: ClassVar[str]
    suite: ClassVar[str]
    fields: ClassVar[tuple[str, ...]] = ()
    subtasks: ClassVar[tuple[str, ...]] = ()

    def check_subtasks(self, names: Sequence[str]) -> None:
        """Raise a ValueError naming an unknown sub-task and the known ones."""
        unknown = [n for n in names if self.subtasks and n not in self.subtasks]
        if unknown:
            raise ValueError(f"{self.name}: unknown sub-task {unknown[0]!r}; known: {', '.join(self.subtasks)}")

    def subtask_hint(self, source: str) -> str | None:
        """The sub-task a whole file holds, from its name (``hotpotqa.jsonl``, ``hotpotqa_e.jsonl``),
        for formats whose rows do not say it; None when the rows say it."""
        return None

    @abstractmethod
    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        """The record of one row (``subtask``: :meth:`subtask_hint` of its file).

        Raises:
            RowError: a missing or ill-typed field, an empty answer list, an unknown sub-task;
                one line, without the file and line (the reader adds them).
        """


FORMATS: dict[str, SuiteFormat] = {}
"""Formats by name; a format module registers its instance with :func:`register`."""


def register(fmt: type[SuiteFormat]) -> type[SuiteFormat]:
    """Class decorator: add an instance of ``fmt`` to :data:`FORMATS` under its ``name``."""
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt()
    return fmt


def required_field(row: Mapping[str, Any], name: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[name]``, which must exist and be of ``kind``."""
    if name not in row:
        raise RowError(f"missing field {name!r}")
    value = row[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        raise RowError(f"field {name!r} must be {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    return value


def answers_of(value: Any, name: str = "answers") -> tuple[str, ...]:
    """A non-empty tuple of answer strings from a string or a list of strings (numbers become text)."""
    items = [value] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)) or not all(
        isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in items
    ):
        raise RowError(f"field {name!r} must be a string or a list of strings, got {type(value).__name__}")
    if not items:
        raise RowError(f"field {name!r} is empty: a row needs at least one gold answer")
    return tuple(str(a) for a in items)
