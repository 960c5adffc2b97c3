"""RULER rows: the files RULER's own scripts write, and kvpress's unified form of them.

RULER (Hsieh et al., https://arxiv.org/abs/2404.06654; code at https://github.com/NVIDIA/RULER)
writes ``<task>/validation.jsonl`` with rows ``index``, ``input`` (the whole prompt, the
model's template already applied), ``outputs`` (the gold answers), ``length`` and
``answer_prefix``; its prediction script feeds ``input + answer_prefix`` untouched
(``scripts/pred/call_api.py``) and scores with ``string_match_all``, or ``string_match_part``
for QA (``scripts/eval/synthetic/constants.py``), with the answer lengths of
``scripts/data/synthetic/constants.py``. kvpress
(https://github.com/NVIDIA/kvpress, ``evaluation/benchmarks/ruler``) splits the same prompts
into ``context``, ``question``, ``answer_prefix``, ``answer``, ``task`` and ``max_new_tokens``
and asks the context and question as one chat turn.

RULER does not truncate: a prompt over the length is an error. A raw RULER prompt is split
into context and question (for query-agnostic runs) where its task's question starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, Turn, answers_of, register, required_field


class Kind(NamedTuple):
    """A RULER task type: its answer length, metric and where its question starts in a prompt."""

    max_new_tokens: int
    metric: str
    question_start: str


KINDS: dict[str, Kind] = {
    "niah": Kind(128, "all", "\nWhat are all the special magic"),
    "variable_tracking": Kind(30, "all", "\nQuestion: Find all variables"),
    "common_words_extraction": Kind(120, "all", "\nQuestion: What are the 10 most common words"),
    "freq_words_extraction": Kind(50, "all", "\nQuestion: Do not provide any explanation."),
    "qa": Kind(32, "part", "\n\nAnswer the question based on the given documents."),
}
"""RULER's task types (``scripts/data/synthetic/constants.py`` and its templates)."""


def kind_of(task: str) -> Kind:
    """The type of a RULER task name (``scripts/synthetic.yaml``: niah_*, vt, cwe, fwe, qa_*)."""
    short = {"vt": "variable_tracking", "cwe": "common_words_extraction", "fwe": "freq_words_extraction"}
    for prefix, kind in (("niah", "niah"), ("qa", "qa"), *short.items()):
        if task == prefix or task.startswith(prefix + "_"):
            return KINDS[kind]
    if task in KINDS:
        return KINDS[task]
    raise RowError(f"unknown RULER task {task!r}; RULER's tasks are niah_*, vt, cwe, fwe and qa_*")


@register
class Ruler(SuiteFormat):
    """The files RULER's ``prepare.py`` writes (the task from the folder or file name)."""

    name = "ruler"
    suite = "RULER"
    fields = ("input", "outputs")

    def subtask_hint(self, source: str) -> str | None:
        path = Path(source)
        return path.parent.name if path.stem in ("validation", "test") else path.stem

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        task = row.get("task", subtask)
        if not isinstance(task, str) or not task:
            raise RowError("no task name: a RULER file lies at <task>/validation.jsonl or is named after its task")
        kind = kind_of(task)
        text = required_field(row, "input")
        cut = text.rfind(kind.question_start)
        if cut <= 0:
            raise RowError(f"no {kind.question_start.strip()!r} in 'input': where does the question of {task} start?")
        prefix = row.get("answer_prefix", "")
        if not isinstance(prefix, str):
            raise RowError(f"field 'answer_prefix' must be a string, got {type(prefix).__name__}")
        return Record(
            subtask=task,
            context=text[:cut],
            turns=(Turn(text[cut:], answers_of(row["outputs"], "outputs"), prefix),),
            metric=kind.metric,
            max_new_tokens=kind.max_new_tokens,
            chat=False,
            truncate=False,
        )


@register
class RulerUnified(SuiteFormat):
    """kvpress's unified RULER rows (``task`` names the RULER task)."""

    name = "ruler_unified"
    suite = "RULER"
    fields = ("context", "question", "answer", "task")

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        task = required_field(row, "task")
        kind = kind_of(task)
        return unified_record(row, task, kind.metric, kind.max_new_tokens)


def unified_record(row: Mapping[str, Any], task: str, metric: str, max_new_tokens: int) -> Record:
    """A record of a unified row (``context``, ``question``, optional ``answer_prefix`` and
    ``max_new_tokens``, ``answer`` a string or a list), asked as one chat turn as kvpress does."""
    prefix = row.get("answer_prefix") or ""
    if not isinstance(prefix, str):
        raise RowError(f"field 'answer_prefix' must be a string, got {type(prefix).__name__}")
    budget = row.get("max_new_tokens", max_new_tokens)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise RowError(f"field 'max_new_tokens' must be an integer >= 1, got {budget!r}")
    return Record(
        subtask=task,
        context=required_field(row, "context"),
        turns=(Turn(required_field(row, "question"), answers_of(row["answer"], "answer"), prefix),),
        metric=metric,
        max_new_tokens=budget,
        chat=True,
        truncate=False,
    )
