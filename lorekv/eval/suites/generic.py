"""Bring your own data: JSONL rows in the unified form (kvpress's), each with its own metric.

Rows: ``context``, ``question``, ``answer`` (a string or a list), and optionally
``answer_prefix``, ``task`` (the sub-task, default ``default``), ``max_new_tokens`` (default
64) and ``metric`` (any metric name; default ``part``, RULER's "any gold answer occurs in the
prediction"; a task's ``metric`` option replaces every row's). Several rows with the same context are
several questions on it (adjacent rows share one compression in query-agnostic runs). The
context and question are asked as one chat turn; a prompt over the length is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, register
from lorekv.eval.suites.ruler import unified_record


@register
class Jsonl(SuiteFormat):
    """Generic unified rows."""

    name = "jsonl"
    suite = "JSONL"
    fields = ("context", "question", "answer")

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        task = row.get("task", "default")
        metric = row.get("metric", "part")
        if not isinstance(task, str) or not isinstance(metric, str):
            raise RowError("fields 'task' and 'metric' must be strings")
        from lorekv.eval.suites.metrics import metric as lookup

        try:
            lookup(metric)
        except ValueError as error:
            raise RowError(str(error)) from None
        return unified_record(row, task, metric, 64)
