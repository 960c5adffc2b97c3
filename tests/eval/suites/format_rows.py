"""Helpers of the format tests: the fixture rows of a suite, parsed records, a row with a field
changed or removed, and the check that a bad row fails in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lorekv.eval.suites.record import Record, RowError, SuiteFormat

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_rows(suite: str, task: str) -> list[dict[str, Any]]:
    """The rows of ``fixtures/<suite>/<task>.jsonl``."""
    lines = (FIXTURES / suite / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def parsed(fmt: SuiteFormat, suite: str, task: str) -> list[Record]:
    """The records of a fixture file, its sub-task taken from its name as the reader does."""
    source = str(FIXTURES / suite / f"{task}.jsonl")
    return [fmt.parse(row, fmt.subtask_hint(source)) for row in fixture_rows(suite, task)]


def changed(row: dict[str, Any], **change: Any) -> dict[str, Any]:
    """A deep copy of ``row`` with fields set, or removed where the value is None."""
    row = json.loads(json.dumps(row))
    for key, value in change.items():
        if value is None:
            del row[key]
        else:
            row[key] = value
    return row


def check_bad_row(fmt: SuiteFormat, task: str | None, row: dict[str, Any], message: str) -> None:
    """``fmt`` refuses ``row`` with a one-line RowError matching ``message``."""
    with pytest.raises(RowError, match=message) as caught:
        fmt.parse(row, task)
    assert "\n" not in str(caught.value)


def check_flags(record: Record, metric: str, max_new_tokens: int) -> None:
    """The record's metric and answer length, asked in a chat turn and truncated in the middle."""
    assert (record.metric, record.max_new_tokens) == (metric, max_new_tokens)
    assert record.chat is True and record.truncate is True
