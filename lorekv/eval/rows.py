"""The row model of evaluation results: what a row must hold, how rows group into sections,
budget columns and (method, budget) cells, and each cell's accuracy with its 95% interval.

The report (:mod:`lorekv.eval.report`) and the figures (:mod:`lorekv.eval.figures`) both read
rows through this module, so a table and a plot of the same results never disagree. Intervals
are computed as :mod:`lorekv.eval.stats` describes.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lorekv.eval.stats import macro_interval, mean_interval

FULL = "full"
"""The method name and budget label of the full cache (nothing evicted)."""

REQUIRED = (
    "model", "mode", "length", "task", "index", "method", "budget_label", "budget", "score", "compression_seconds",
)  # fmt: skip
"""Row keys the report reads; other keys of the runner's rows are carried but not needed."""

IDENTITY = ("model", "mode", "length", "task", "index", "method", "budget_label", "sampler_seed")
"""Keys that identify a row: two rows with the same values are a duplicate (an error). A row without
``sampler_seed`` (a deterministic method, or a file written before seeds) has None there."""

Section = tuple[str, str, int]
"""(model, mode, length): rows of one section are compared with each other, never across."""

Cell = tuple[str, str]
"""(method, budget_label): one cell of a method x budget table."""


def split_records(records: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, headers) of a results stream that mixes ``{"type": "row"}`` and ``{"type": "header"}``.

    Records without a type are rows; other types are ignored.
    """
    rows, headers = [], []
    for record in records:
        kind = record.get("type", "row")
        if kind == "row":
            rows.append(dict(record))
        elif kind == "header":
            headers.append(dict(record))
    return rows, headers


def _row_name(row: Mapping[str, Any], position: int) -> str:
    return f"row {position} (id {row.get('id', '?')!r})"


def check_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows as a list, checked: required keys present, scores in [0, 1], the full cache
    labeled as such, and no two rows with the same :data:`IDENTITY` (a duplicate would count one
    sample twice, and usually means two runs were concatenated)."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[Any, ...], int] = {}
    for position, row in enumerate(rows):
        if row.get("type", "row") != "row":
            continue
        missing = [key for key in REQUIRED if key not in row]
        if missing:
            raise ValueError(f"rows: {_row_name(row, position)} lacks {missing}")
        score = row["score"]
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
            raise ValueError(f"rows: {_row_name(row, position)} has score {score!r}; scores lie in [0, 1]")
        if (row["method"] == FULL) != (row["budget_label"] == FULL):
            raise ValueError(
                f"rows: {_row_name(row, position)} has method {row['method']!r} with budget_label "
                f"{row['budget_label']!r}; the full cache is method {FULL!r} with budget_label {FULL!r}, and only it"
            )
        key = tuple(row.get(k) for k in IDENTITY)
        if key in seen:
            shown = ", ".join(f"{k}={v!r}" for k, v in zip(IDENTITY, key, strict=True))
            raise ValueError(f"rows: duplicate ({shown}) at rows {seen[key]} and {position}")
        seen[key] = position
        out.append(dict(row))
    return out


def _first_appearance(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def sections(rows: Sequence[Mapping[str, Any]]) -> dict[Section, list[Mapping[str, Any]]]:
    """Rows grouped by (model, mode, length), sections sorted by model, mode and length."""
    grouped: dict[Section, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((str(row["model"]), str(row["mode"]), int(row["length"])), []).append(row)
    return dict(sorted(grouped.items()))


def section_slug(section: Section) -> str:
    """A file-name-safe name of a section, e.g. ``SmolLM2-360M-query_aware-4096``."""
    model, mode, length = section
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{model}-{mode}-{length}").strip("-")


def methods_of(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Method names in order of first appearance."""
    return _first_appearance(str(r["method"]) for r in rows)


def budget_value(rows: Sequence[Mapping[str, Any]], label: str) -> float:
    """The numeric budget of ``label``: B itself, or for a ratio label the median of the
    per-sample budgets it gave (prompts differ in length, so a ratio is not one B)."""
    budgets = [r["budget"] for r in rows if r["budget_label"] == label and r["budget"] is not None]
    if not budgets:
        raise ValueError(f"budget_label {label!r} has no numeric budget in these rows")
    return float(statistics.median(budgets))


def kept_fraction(rows: Sequence[Mapping[str, Any]], label: str) -> float:
    """The median over the rows of ``label`` of the fraction of the prompt's candidates it keeps
    (B / candidates): the one axis on which fixed budgets and ratios compare."""
    fractions = [r["budget"] / r["candidates"] for r in rows if r["budget_label"] == label and r["budget"] is not None]
    if not fractions:
        raise ValueError(f"budget_label {label!r} has no numeric budget in these rows")
    return float(statistics.median(fractions))


def budget_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Budget columns, full cache excluded: fixed budgets (B=...) by B, then ratios by ratio."""

    def order(label: str) -> tuple[int, float]:
        ratios = [r["ratio"] for r in rows if r["budget_label"] == label and r.get("ratio") is not None]
        return (1, float(ratios[0])) if ratios else (0, budget_value(rows, label))

    labels = {str(r["budget_label"]) for r in rows} - {FULL}
    return sorted(labels, key=order)


def cell_label(method: str, label: str) -> str:
    """The budget label a method's rows carry in column ``label``: the full cache has one."""
    return FULL if method == FULL else label


def scores_by_task(rows: Sequence[Mapping[str, Any]], method: str, label: str) -> dict[str, dict[int, float]]:
    """task -> sample index -> score of one cell, tasks sorted by name."""
    wanted = cell_label(method, label)
    out: dict[str, dict[int, float]] = {}
    for row in rows:
        if row["method"] == method and row["budget_label"] == wanted:
            out.setdefault(str(row["task"]), {})[int(row["index"])] = float(row["score"])
    return dict(sorted(out.items()))


def paired_scores(
    rows: Sequence[Mapping[str, Any]], method: str, other: str, label: str
) -> dict[str, tuple[list[float], list[float]]]:
    """task -> (scores of ``method``, scores of ``other``) in column ``label`` on the samples of
    that task both answered (matched by sample index, in ``method``'s row order; the full cache
    pairs with every column); tasks without a shared sample are left out."""
    mine, theirs = scores_by_task(rows, method, label), scores_by_task(rows, other, label)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for task, by_index in mine.items():
        shared = [i for i in by_index if i in theirs.get(task, {})]
        if shared:
            out[task] = ([by_index[i] for i in shared], [theirs[task][i] for i in shared])
    return out


@dataclass(frozen=True)
class CellStats:
    """Mean score of a cell with its 95% interval, over ``n`` samples of ``tasks`` tasks."""

    mean: float
    lo: float
    hi: float
    n: int
    tasks: int


def task_cell(scores: Mapping[int, float], *, seed: int, resamples: int) -> CellStats:
    mean, lo, hi = mean_interval(list(scores.values()), seed=seed, resamples=resamples)
    return CellStats(mean, lo, hi, len(scores), 1)


def macro_cell(by_task: Mapping[str, Mapping[int, float]], *, seed: int, resamples: int) -> CellStats:
    mean, lo, hi = macro_interval({t: list(s.values()) for t, s in by_task.items()}, seed=seed, resamples=resamples)
    return CellStats(mean, lo, hi, sum(len(s) for s in by_task.values()), len(by_task))


def macro_cells(rows: Sequence[Mapping[str, Any]], *, seed: int = 0, resamples: int = 10_000) -> dict[Cell, CellStats]:
    """Macro accuracy of every (method, budget_label) cell of one section that has rows."""
    out: dict[Cell, CellStats] = {}
    labels = budget_labels(rows)
    for method in methods_of(rows):
        for label in [FULL] if method == FULL else labels:
            by_task = scores_by_task(rows, method, label)
            if by_task:
                out[(method, label)] = macro_cell(by_task, seed=seed, resamples=resamples)
    return out


def median_seconds(rows: Sequence[Mapping[str, Any]]) -> dict[Cell, float]:
    """Median ``compression_seconds`` of every (method, budget_label) cell of one section."""
    values: dict[Cell, list[float]] = {}
    for row in rows:
        values.setdefault((str(row["method"]), str(row["budget_label"])), []).append(float(row["compression_seconds"]))
    return {cell: float(statistics.median(v)) for cell, v in values.items()}


def over_seeds(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with each prompt's sampler seeds averaged into one row: the mean score and compression
    seconds, ``sampler_seeds`` the count (other fields: the first seed's). Rows without a seed pass as
    they are. Every table then compares prompt by prompt, a seeded method by its mean over seeds."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in IDENTITY[:-1]) + (row.get("sampler_seed") is None,), []).append(row)
    out = []
    for group in groups.values():
        if group[0].get("sampler_seed") is None:
            out.extend(dict(row) for row in group)
            continue
        mean = {k: statistics.fmean(float(r[k]) for r in group) for k in ("score", "compression_seconds")}
        out.append({**group[0], **mean, "sampler_seed": None, "sampler_seeds": len(group)})
    return out


def seed_spread(rows: Sequence[Mapping[str, Any]]) -> dict[Cell, dict[int, float]]:
    """Per (method, budget_label) cell with sampler seeds: each seed's macro accuracy (mean over tasks of
    each task's mean over its prompts), by seed."""
    by_seed: dict[Cell, dict[int, list[Mapping[str, Any]]]] = {}
    for row in rows:
        if row.get("sampler_seed") is not None:
            cell = (str(row["method"]), str(row["budget_label"]))
            by_seed.setdefault(cell, {}).setdefault(int(row["sampler_seed"]), []).append(row)
    out: dict[Cell, dict[int, float]] = {}
    for cell, seeds in by_seed.items():
        for seed, seed_rows in sorted(seeds.items()):
            tasks = scores_by_task(seed_rows, *cell)
            out.setdefault(cell, {})[seed] = statistics.fmean(statistics.fmean(s.values()) for s in tasks.values())
    return out
