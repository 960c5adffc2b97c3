"""The suites' own tables in a report: scores x 100 per sub-task and their average, as the suites tabulate them.

LongBench reports each dataset's mean score x 100 and the average over datasets (its
``eval.py`` and paper tables); RULER each task's and their average; LongBench v2 its accuracy
overall and by difficulty and length (``result.py``); LongBench-E by length group. A row's
``suite`` says which suite it belongs to and its ``tags`` what besides the sub-task it is
averaged by (questions of one tag value pooled, as those suites pool them). These tables
stand beside the report's intervals and paired differences; they carry no interval because
the suites publish none, and the sample count of each column is stated.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from lorekv.eval.markdown import md_table
from lorekv.eval.rows import FULL, budget_labels, cell_label, methods_of


def _mean100(scores: Sequence[float]) -> str:
    return f"{100 * statistics.fmean(scores):.2f}" if scores else "—"


def _subtask(row: Mapping[str, Any]) -> str:
    return str(row["task"]).split("/", 1)[-1]


def suite_tables(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines of every suite's tables for one report section's rows ([] when no row has a suite)."""
    suites = sorted({str(r["suite"]) for r in rows if r.get("suite")})
    lines: list[str] = []
    for suite in suites:
        mine = [r for r in rows if r.get("suite") == suite]
        lines += [f"### {suite} scores", ""]
        subtasks = sorted({_subtask(r) for r in mine})
        columns = [*subtasks, "Avg"] if len(subtasks) > 1 else subtasks
        lines += _table(mine, columns, lambda r: [_subtask(r)])
        counts = {s: len({r["index"] for r in mine if _subtask(r) == s}) for s in subtasks}
        count_text = ", ".join(f"{s} {n}" for s, n in counts.items())
        lines += [
            f"Mean score x 100 per sub-task (questions: {count_text})"
            + ("; Avg: the mean over sub-tasks, as the suite averages." if len(subtasks) > 1 else "."),
            "",
        ]
        for tag in sorted({k for r in mine for k in (r.get("tags") or {})}):
            values = sorted({str(r["tags"][tag]) for r in mine if tag in (r.get("tags") or {})})
            lines += [f"**{suite} by {tag}** (mean score x 100 over the questions of each {tag})", ""]
            lines += _table(
                mine, values, lambda r, tag=tag: [str(r["tags"][tag])] if tag in (r.get("tags") or {}) else []
            )
            lines += [""]
    return lines


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], keys: Any) -> list[str]:
    """method x budget rows, a column per key value (``Avg``: the mean of the other columns)."""
    body = []
    for method in methods_of(rows):
        for label in [FULL] if method == FULL else budget_labels(rows):
            wanted = cell_label(method, label)
            cell_rows = [r for r in rows if r["method"] == method and r["budget_label"] == wanted]
            if not cell_rows:
                continue
            scores: dict[str, list[float]] = {}
            for row in cell_rows:
                for key in keys(row):
                    scores.setdefault(key, []).append(float(row["score"]))
            values = [_mean100(scores.get(c, [])) for c in columns if c != "Avg"]
            if "Avg" in columns:
                means = [statistics.fmean(scores[c]) for c in columns if c != "Avg" and scores.get(c)]
                values.append(_mean100(means) if len(means) == len(columns) - 1 else "—")
            body.append([f"`{method}`", wanted, *values])
    return [*md_table(["method", "budget", *columns], body), ""]
