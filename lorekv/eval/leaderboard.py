"""The leaderboard: which method to use, and what it costs, in one table and one figure per setting.

A setting is one (model, mode, length) section of the results. Its table lists every method,
best first, with its macro accuracy and 95% interval at every budget column (kept-token budgets
and compression ratios alike, each with the fraction of the prompt it keeps) and its compression
time as a multiple of transformers' own prefill of the same prompt. At each budget the best
method is the one with the highest macro accuracy; every other method's macro paired difference
to it (:func:`lorekv.eval.stats.macro_paired_difference`, on the samples both answered) says
whether it is *tied* with the best (not a finding) or behind it. Bold marks the best and the
methods tied with it: what a reader can choose between at that budget on this evidence.

The page is generated, never edited by hand: ``lorekv report --leaderboard`` writes it from
results files, and the same rows always give the same text (seeded bootstraps).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorekv.eval.markdown import md_table
from lorekv.eval.report import MISSING, fmt_interval, run_summary
from lorekv.eval.rows import (
    FULL,
    Cell,
    CellStats,
    Section,
    budget_labels,
    check_rows,
    kept_fraction,
    macro_cells,
    methods_of,
    over_seeds,
    paired_scores,
    section_slug,
    sections,
    split_records,
)
from lorekv.eval.stats import PairedDifference, macro_paired_difference

MODE_NAMES = {"query_aware": "query-aware", "query_agnostic": "query-agnostic", "decoding": "while decoding"}
"""How a mode reads in a heading: the question in the prompt, or the context compressed before it."""


@dataclass(frozen=True)
class Standing:
    """One method at one budget column: its accuracy, and how it stands against the column's best.

    ``to_best`` is None for the best method itself; ``tied`` is True for the best and for every
    method whose difference to it is not a finding.
    """

    stats: CellStats
    to_best: PairedDifference | None
    tied: bool


def standings(
    rows: Sequence[Mapping[str, Any]], *, seed: int = 0, resamples: int = 10_000
) -> tuple[dict[Cell, Standing], dict[str, str]]:
    """(standing of every (method, budget_label) cell with rows, the best method of each budget
    column) of one section's rows (seeds averaged, see :func:`lorekv.eval.rows.over_seeds`).

    The best is the highest macro mean (the first method in order of appearance on a tie); the
    full cache is a reference, never a contender.
    """
    cells = macro_cells(rows, seed=seed, resamples=resamples)
    out: dict[Cell, Standing] = {}
    best: dict[str, str] = {}
    contenders = [m for m in methods_of(rows) if m != FULL]
    for label in budget_labels(rows):
        present = [m for m in contenders if (m, label) in cells]
        if not present:
            continue
        leader = max(present, key=lambda m: cells[(m, label)].mean)
        best[label] = leader
        for method in present:
            if method == leader:
                out[(method, label)] = Standing(cells[(method, label)], None, True)
                continue
            by_task = paired_scores(rows, method, leader, label)
            a, b = {t: p[0] for t, p in by_task.items()}, {t: p[1] for t, p in by_task.items()}
            diff = macro_paired_difference(a, b, seed=seed, resamples=resamples) if by_task else None
            tied = diff is not None and not diff.significant
            out[(method, label)] = Standing(cells[(method, label)], diff, tied)
    if (FULL, FULL) in cells:
        out[(FULL, FULL)] = Standing(cells[(FULL, FULL)], None, False)
    return out, best


def prefill_multiple(rows: Sequence[Mapping[str, Any]], method: str) -> float | None:
    """The median over a method's rows of compression seconds / transformers' prefill of the same
    prompt timed in the same process; None when no row carries that prefill."""
    ratios = [
        float(r["compression_seconds"]) / float(r["seconds"]["reference_prefill"])
        for r in rows
        if r["method"] == method and (r.get("seconds") or {}).get("reference_prefill")
    ]
    return float(statistics.median(ratios)) if ratios else None


def ranking(rows: Sequence[Mapping[str, Any]], cells: Mapping[Cell, CellStats]) -> list[str]:
    """The section's methods best first: by the mean over budget columns of their macro accuracy
    (``cells``, :func:`lorekv.eval.rows.macro_cells`; order of appearance on a tie); the full
    cache first of all, as the reference."""
    methods = methods_of(rows)
    labels = budget_labels(rows)

    def mean_accuracy(method: str) -> float:
        values = [cells[(method, lab)].mean for lab in labels if (method, lab) in cells]
        return statistics.fmean(values) if values else -1.0

    ranked = sorted((m for m in methods if m != FULL), key=lambda m: -mean_accuracy(m))
    return ([FULL] if FULL in methods else []) + ranked


def _difference_cell(table: Mapping[Cell, Standing], best: Mapping[str, str], method: str, label: str) -> str:
    if best.get(label) == method:
        return "best"
    standing = table.get((method, label))
    if standing is None or standing.to_best is None:
        return MISSING
    diff = standing.to_best
    return f"{diff.mean:+.2f} [{diff.lo:+.2f}, {diff.hi:+.2f}]" + (" *" if diff.significant else "")


def _tasks_line(rows: Sequence[Mapping[str, Any]]) -> str:
    tasks: dict[str, set[int]] = {}
    for row in rows:
        tasks.setdefault(str(row["task"]), set()).add(int(row["index"]))
    parts = ", ".join(f"{task} ({len(indices)})" for task, indices in sorted(tasks.items()))
    total = sum(len(indices) for indices in tasks.values())
    return f"{total} samples over {len(tasks)} task{'s' if len(tasks) != 1 else ''}: {parts}"


def section_tables(rows: Sequence[Mapping[str, Any]], *, seed: int = 0, resamples: int = 10_000) -> list[str]:
    """The accuracy table and the difference-to-the-best table of one section, as Markdown lines."""
    table, best = standings(rows, seed=seed, resamples=resamples)
    labels = sorted(budget_labels(rows), key=lambda label: kept_fraction(rows, label))
    columns = [f"{label} ({kept_fraction(rows, label):.1%})" for label in labels]
    order = ranking(rows, {cell: standing.stats for cell, standing in table.items()})
    accuracy, differences = [], []
    for method in order:
        cost = prefill_multiple(rows, method)
        name = f"`{method}` (full cache)" if method == FULL else f"`{method}`"
        row = [name, MISSING if cost is None else f"{cost:.2f}x"]
        for label in labels:
            standing = table.get((method, FULL if method == FULL else label))
            if standing is None:
                row.append(MISSING)
                continue
            text = fmt_interval(standing.stats.mean, standing.stats.lo, standing.stats.hi)
            row.append(f"**{text}**" if standing.tied else text)
        accuracy.append(row)
        if method != FULL:
            differences.append([name] + [_difference_cell(table, best, method, label) for label in labels])
    return [
        "**Accuracy** (macro over tasks, 95% interval; bold: the best method at that budget and every method "
        "whose paired difference to it is not a finding). `x prefill`: median compression time over transformers' "
        "own prefill of the same prompt, timed in the same process. Column headings: the budget and the median "
        "fraction of the prompt it keeps, smallest first.",
        "",
        *md_table(["method", "x prefill", *columns], accuracy),
        "",
        "**Difference to the best method at each budget** (macro paired difference on the samples both answered, "
        "95% stratified bootstrap interval; `*`: a finding, the interval excludes 0 and the exact sign test gives "
        "p < 0.05).",
        "",
        *md_table(["method", *columns], differences),
        "",
    ]


def figure_path(section: Section) -> str:
    """The figure of a setting, relative to the leaderboard page."""
    return f"figures/{section_slug(section)}-leaderboard.png"


def leaderboard_command(results: Sequence[str | Path], out_dir: str | Path, *, tasks: Sequence[str] = ()) -> str:
    """The command line that writes the leaderboard of ``results`` (only ``tasks``, when given) into
    ``out_dir``, as the page cites it."""
    words = ["lorekv report --leaderboard --out", Path(out_dir).as_posix()]
    words += [f"--task {task}" for task in tasks]
    return " ".join(words + [Path(r).as_posix() for r in results])


def build_leaderboard(
    rows: Iterable[Mapping[str, Any]],
    headers: Iterable[Mapping[str, Any]] = (),
    *,
    figures: Mapping[Section, str] | None = None,
    source: str | None = None,
    seed: int = 0,
    resamples: int = 10_000,
) -> str:
    """The leaderboard page of result ``rows`` as Markdown: a section per setting, its figure (a
    relative path from ``figures``), its two tables; ``source`` (the command that wrote it) and
    the runs' machines and versions at the end."""
    rows_in, more_headers = split_records(rows)
    checked = check_rows(rows_in)
    if not checked:
        raise ValueError("rows: no result rows for a leaderboard")
    lines = ["# Leaderboard", ""]
    if source:
        lines += [f"Generated by `{source}` from the results files it names; do not edit by hand.", ""]
    for section, section_rows in sections(checked).items():
        model, mode, length = section
        averaged = over_seeds(section_rows)
        lines += [f"## {model} · {MODE_NAMES.get(mode, mode)} · {length} tokens", ""]
        lines += [_tasks_line(averaged) + ".", ""]
        if figures and section in figures:
            lines += [f"![Accuracy vs kept fraction, {model}, {mode}]({figures[section]})", ""]
        lines += section_tables(averaged, seed=seed, resamples=resamples)
    lines += ["## Runs", "", *run_summary([*headers, *more_headers])]
    return "\n".join(lines).rstrip() + "\n"


def write_leaderboard(
    rows: Iterable[Mapping[str, Any]],
    headers: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    figures: bool = True,
    source: str | None = None,
    seed: int = 0,
    resamples: int = 10_000,
) -> Path:
    """Write ``leaderboard.md`` and (``figures``) one ``figures/<setting>-leaderboard.png`` per
    setting under ``out_dir``; return the page's path. Rows are checked before anything is written."""
    rows_in, more_headers = split_records(rows)
    checked = check_rows(rows_in)
    if not checked:
        raise ValueError("rows: no result rows for a leaderboard")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    links: dict[Section, str] = {}
    if figures:
        from lorekv.eval.figures import accuracy_vs_kept_fraction  # matplotlib only when figures are wanted

        for section, section_rows in sections(checked).items():
            averaged = over_seeds(section_rows)
            links[section] = figure_path(section)
            order = ranking(averaged, macro_cells(averaged, seed=seed, resamples=resamples))
            accuracy_vs_kept_fraction(averaged, out / links[section], order=order, seed=seed, resamples=resamples)
    text = build_leaderboard(
        checked, [*headers, *more_headers], figures=links, source=source, seed=seed, resamples=resamples
    )
    page = out / "leaderboard.md"
    partial = page.with_name(page.name + ".tmp")
    partial.write_text(text, encoding="utf-8")
    partial.replace(page)
    return page


__all__ = [
    "Standing",
    "build_leaderboard",
    "figure_path",
    "leaderboard_command",
    "prefill_multiple",
    "ranking",
    "standings",
    "write_leaderboard",
]
