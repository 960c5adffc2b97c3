"""The Markdown report of a grid run: accuracy tables with intervals, paired differences, cost.

Input rows are the grid runner's result rows (one per sample and cell; see the module's
``REQUIRED`` keys) and optionally its header records (run metadata). The report has one
section per (model, mode, length); in each, per task and averaged over tasks (macro), a
method x budget table of "mean [95% interval]" with sample counts, the paired differences of
every method to a reference method on the samples both answered, the benchmark suites' own
averages for rows read from their files (:mod:`lorekv.eval.suites.report`), the median compression time,
and links to the figures (:mod:`lorekv.eval.figures`). How intervals are computed is in
:mod:`lorekv.eval.stats`. Methods are compared by paired differences because every method sees
the same samples, and a difference whose interval covers 0 is not a finding; the full cache's
accuracy stands beside every method because a task the full cache fails says nothing about
eviction.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lorekv.eval.markdown import md_table
from lorekv.eval.rows import (
    FULL,
    Cell,
    CellStats,
    Section,
    budget_labels,
    cell_label,
    check_rows,
    kept_fraction,
    macro_cells,
    median_seconds,
    methods_of,
    over_seeds,
    paired_scores,
    scores_by_task,
    section_slug,
    sections,
    seed_spread,
    split_records,
    task_cell,
)
from lorekv.eval.stats import PairedDifference, paired_difference
from lorekv.eval.suites.report import suite_tables

FigureLinks = Mapping[Section, Sequence[tuple[str, str]]]
"""Per section, (caption, relative path) of each figure written for it."""


# --- formatting ----------------------------------------------------------------------------

MISSING = "—"
"""A table cell with no rows."""


def fmt_interval(mean: float, lo: float, hi: float) -> str:
    """``0.70 [0.40, 0.89]``: two decimals, enough for n up to a few hundred."""
    return f"{mean:.2f} [{lo:.2f}, {hi:.2f}]"


def fmt_difference(diff: PairedDifference) -> str:
    """``+0.10 [-0.05, +0.25] 3/1/6 p=0.62``: mean difference, interval, wins/losses/ties and the
    exact sign-test p; ``*`` marks a finding (interval excludes 0 and p < 0.05)."""
    mark = " *" if diff.significant else ""
    tally = f"{diff.wins}/{diff.losses}/{diff.ties}"
    return f"{diff.mean:+.2f} [{diff.lo:+.2f}, {diff.hi:+.2f}]{mark} {tally} p={diff.p_sign:.2g}"


def fmt_seconds(seconds: float) -> str:
    """Three significant digits, trailing zeros kept: ``1.00 s``, ``0.0123 s``, ``123 s``."""
    return f"{seconds:.0f} s" if seconds >= 100 else f"{seconds:#.3g} s"


def _method_name(method: str) -> str:
    return f"`{method}` (full cache)" if method == FULL else f"`{method}`"


def _tasks_text(tasks: int, what: str) -> str:
    """``, 2 tasks`` in macro tables (a macro mean over fewer tasks is not comparable), else nothing."""
    return "" if what == "task" else f", {tasks} task{'s' if tasks != 1 else ''}"


def stats_table(
    methods: Sequence[str], columns: Sequence[str], cells: Mapping[Cell, CellStats], *, what: str
) -> tuple[str, list[str]]:
    """(count line, table lines) of a method x budget table of ``cells``; methods without cells are left out.

    The most common sample count (and task count) is stated once in the count line; a cell
    with another count carries its own ``(n=..)``, so every number has its count in sight.
    """
    methods = [m for m in methods if any((m, cell_label(m, c)) in cells for c in columns)]
    present = [cells[(m, cell_label(m, c))] for m in methods for c in columns if (m, cell_label(m, c)) in cells]
    common = Counter((s.n, s.tasks) for s in present).most_common(1)[0][0]
    body = []
    for method in methods:
        row = [_method_name(method)]
        for column in columns:
            stats = cells.get((method, cell_label(method, column)))
            if stats is None:
                row.append(MISSING)
                continue
            suffix = "" if (stats.n, stats.tasks) == common else f" (n={stats.n}{_tasks_text(stats.tasks, what)})"
            row.append(fmt_interval(stats.mean, stats.lo, stats.hi) + suffix)
        body.append(row)
    line = f"n = {common[0]} samples{_tasks_text(common[1], what)} per cell"
    if len({(s.n, s.tasks) for s in present}) > 1:
        line += " unless the cell states its own"
    return line, md_table(["method", *columns], body)


# --- report parts --------------------------------------------------------------------------

HEADER_KEYS = ("lorekv", "commit", "packages", "machine", "threads", "device", "dtype", "started")


def _fmt_mapping(mapping: Any) -> str:
    if isinstance(mapping, Mapping):
        return ", ".join(f"{k} {v}" for k, v in mapping.items()) or MISSING
    return str(mapping)


def run_summary(headers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The machine, versions and commit of each distinct header, tolerant of missing keys."""
    distinct: list[dict[str, Any]] = []
    for header in headers:
        summary = {k: header[k] for k in HEADER_KEYS if k in header}
        if summary and summary not in distinct:
            distinct.append(summary)
    if not distinct:
        return ["Run metadata: none given (no header records).", ""]
    lines = []
    for number, summary in enumerate(distinct, start=1):
        title = "Run" if len(distinct) == 1 else f"Run {number}"
        lines.append(f"**{title}**" + (f" started {summary['started']}" if "started" in summary else ""))
        version = " ".join(
            part
            for part in (
                f"lorekv {summary['lorekv']}" if "lorekv" in summary else "",
                f"(commit `{summary['commit']}`)" if "commit" in summary else "",
            )
            if part
        )
        if version:
            lines.append(f"- {version}")
        if "packages" in summary:
            lines.append(f"- packages: {_fmt_mapping(summary['packages'])}")
        if "machine" in summary:
            lines.append(f"- machine: {_fmt_mapping(summary['machine'])}")
        setup = [f"{k} {summary[k]}" for k in ("device", "dtype", "threads") if k in summary]
        if setup:
            lines.append("- " + ", ".join(setup))
        lines.append("")
    return lines


def per_task_tables(rows: Sequence[Mapping[str, Any]], *, seed: int, resamples: int) -> list[str]:
    methods, columns = methods_of(rows), budget_labels(rows) or [FULL]
    lines = ["### Accuracy per task", ""]
    for task in sorted({str(r["task"]) for r in rows}):
        task_rows = [r for r in rows if r["task"] == task]
        cells: dict[Cell, CellStats] = {}
        for method in methods:
            for column in columns:
                scores = scores_by_task(task_rows, method, column).get(task)
                if scores:
                    cells[(method, cell_label(method, column))] = task_cell(scores, seed=seed, resamples=resamples)
        count, table = stats_table(methods, columns, cells, what="task")
        lines += [f"**{task}** ({count})", "", *table, ""]
    return lines


def macro_table(rows: Sequence[Mapping[str, Any]], *, seed: int, resamples: int) -> list[str]:
    methods, columns = methods_of(rows), budget_labels(rows) or [FULL]
    cells = macro_cells(rows, seed=seed, resamples=resamples)
    count, table = stats_table(methods, columns, cells, what="macro")
    return [
        "### Averaged over tasks (macro)",
        "",
        "Mean over tasks of each task's mean, so every task weighs the same; interval: for 0/1 scores the "
        "stratified Agresti–Coull interval (per-task variances p̃(1-p̃)/(n+4) combined), else a bootstrap "
        f"stratified by task; {count}.",
        "",
        *table,
        "",
    ]


def paired_table(rows: Sequence[Mapping[str, Any]], reference: str, *, seed: int, resamples: int) -> list[str]:
    """Differences of every method to ``reference``, pooled over the section's paired samples."""
    head = [f"### Paired differences to `{reference}`", ""]
    if reference not in methods_of(rows):
        return head + [f"The reference `{reference}` has no rows in this section.", ""]
    methods = [m for m in methods_of(rows) if m != reference]
    columns = budget_labels(rows) or [FULL]
    if not methods:
        return head + ["No other method to compare.", ""]
    body = []
    for method in methods:
        cells = [_method_name(method)]
        for column in columns:
            by_task = paired_scores(rows, method, reference, column)
            if not by_task:
                cells.append(MISSING)
                continue
            a = [s for mine, _ in by_task.values() for s in mine]
            b = [s for _, theirs in by_task.values() for s in theirs]
            diff = paired_difference(a, b, seed=seed, resamples=resamples)
            cells.append(f"{fmt_difference(diff)} (n={diff.n})")
        body.append(cells)
    return head + [
        f"Method minus `{reference}` on the samples both answered (matched by task and sample index; "
        "the full cache pairs with every budget), pooled over tasks: mean difference, 95% paired bootstrap "
        "interval, wins/losses/ties and the exact sign-test p (McNemar for 0/1 scores); `*` marks a finding: the "
        "interval excludes 0 and p < 0.05. An interval that covers 0 is not a finding.",
        "",
        *md_table(["method", *columns], body),
        "",
    ]


def seed_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each seeded method's accuracy per sampler seed: the mean over seeds, the lowest and highest, and
    the range (the section's raw rows, before :func:`over_seeds`); nothing when no row has a seed."""
    spread = seed_spread(rows)
    if not spread:
        return []
    methods = [m for m in methods_of(rows) if any(cell[0] == m for cell in spread)]
    columns = [c for c in budget_labels(rows) if any(cell[1] == c for cell in spread)]
    body = []
    for method in methods:
        cells = [_method_name(method)]
        for column in columns:
            values = list(spread.get((method, column), {}).values())
            cells.append(
                f"{statistics.fmean(values):.2f} ({min(values):.2f}–{max(values):.2f}; range "
                f"{max(values) - min(values):.2f}; {len(values)} seeds)"
                if values
                else MISSING
            )
        body.append(cells)
    return [
        "### Spread over sampler seeds",
        "",
        "Macro accuracy of each sampler seed on the same prompts: mean over seeds (lowest–highest; range; "
        "seeds). Every other table here scores a seeded method by each prompt's mean over its seeds.",
        "",
        *md_table(["method", *columns], body),
        "",
    ]


def prefill_ratios(rows: Sequence[Mapping[str, Any]]) -> dict[Cell, float]:
    """Median of ``compression_seconds`` / transformers' own prefill of the same prompt (the
    row's ``seconds["reference_prefill"]``) per (method, budget_label); cells without it are absent."""
    values: dict[Cell, list[float]] = {}
    for row in rows:
        floor = row["seconds"].get("reference_prefill")
        if floor:
            values.setdefault((str(row["method"]), str(row["budget_label"])), []).append(
                float(row["compression_seconds"]) / float(floor)
            )
    return {cell: float(statistics.median(v)) for cell, v in values.items()}


def time_table(rows: Sequence[Mapping[str, Any]], reference: str, *, decoding: bool = False) -> list[str]:
    methods, columns = methods_of(rows), budget_labels(rows) or [FULL]
    medians, floors = median_seconds(rows), prefill_ratios(rows)
    body = []
    for method in methods:
        cells = [_method_name(method)]
        for column in columns:
            key = (method, cell_label(method, column))
            mine = medians.get(key)
            theirs = medians.get((reference, cell_label(reference, column)))
            if mine is None:
                cells.append(MISSING)
                continue
            ratios = [] if theirs is None or theirs <= 0 else [f"{mine / theirs:.2f}x ref"]
            ratios += [f"{floors[key]:.2f}x prefill"] if key in floors else []
            cells.append(fmt_seconds(mine) + (f" ({', '.join(ratios)})" if ratios else ""))
        body.append(cells)
    floor_note = (
        " and (`x prefill`) the median ratio to transformers' own SDPA prefill of the same prompt "
        "(`model(ids, logits_to_keep=1)`, timed in the same process: the floor every method pays)"
        if floors
        else "; transformers' own prefill was not timed in this run"
    )
    what = (
        "the compressions made while the answer was generated, a part of its decode time"
        if decoding
        else "prefill + sampling + scoring + selection"
    )
    return [
        "### Compression time",
        "",
        f"Median `compression_seconds` ({what}) over the samples of this run, "
        f"its ratio to `{reference}`'s median at the same budget (`x ref`){floor_note}. Work shared between cells "
        "(one prefill for several methods) is counted in full in every cell that uses it, as a standalone run "
        "would pay it.",
        "",
        *md_table(["method", *columns], body),
        "",
    ]


def budget_fractions(rows: Sequence[Mapping[str, Any]], *, decoding: bool = False) -> list[str]:
    """One line: each budget column as the median fraction of the prompt's candidates it keeps
    (``decoding``: of every token fed, prompt and answer)."""
    labels = list(dict.fromkeys(str(r["budget_label"]) for r in rows if r["budget"] is not None))
    if not labels:
        return []
    parts = [f"{label} keeps {kept_fraction(rows, label):.1%}" for label in labels]
    of = "every token fed (prompt and answer)" if decoding else "the prompt"
    return [f"Budgets as a fraction of {of} (median over samples): " + ", ".join(parts) + ".", ""]


def held_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``decoding`` mode: each cell's bytes held against the full cache's on the same sample."""
    if FULL not in methods_of(rows):
        return []
    full = {(r["task"], r["index"]): r for r in rows if r["method"] == FULL}
    columns = budget_labels(rows)
    body = []
    for method in methods_of(rows):
        if method == FULL:
            continue
        cells = [_method_name(method)]
        for column in columns:
            mine = [r for r in rows if r["method"] == method and r["budget_label"] == column]
            pairs = [(r, full[(r["task"], r["index"])]) for r in mine if (r["task"], r["index"]) in full]
            if not pairs:
                cells.append(MISSING)
                continue
            held = statistics.median(r["kv_bytes_after"] / f["kv_bytes_before"] for r, f in pairs)
            cells.append(f"{held:.2f}")
        body.append(cells)
    return [
        "### Cache held",
        "",
        f"Median over the samples of each cell of the bytes the bounded cache allocated (its share of a batch's) "
        f"over the bytes `{FULL}`'s cache held at the end of the same sample's answer. Time per token is not "
        "compared here: answers of different lengths share one prefill (`tools/decode_cost.py` times every cache "
        "on the same tokens).",
        "",
        *md_table(["method", *columns], body),
        "",
    ]


def figure_lines(links: Sequence[tuple[str, str]]) -> list[str]:
    lines = ["### Figures", ""]
    if not links:
        return lines + ["No figures were written for this section.", ""]
    for caption, path in links:
        lines += [f"![{caption}]({path})", ""]
    return lines


def default_reference(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The first method in the rows that is not the full cache, or the full cache if it is all."""
    methods = methods_of(rows)
    return next((m for m in methods if m != FULL), methods[0] if methods else None)


def build_report(
    rows: Iterable[Mapping[str, Any]],
    headers: Iterable[Mapping[str, Any]] = (),
    *,
    reference: str | None = None,
    title: str = "lorekv evaluation",
    figures: FigureLinks | None = None,
    seed: int = 0,
    resamples: int = 10_000,
) -> str:
    """The Markdown report of result ``rows`` (header records among them are used as headers).

    ``reference``: the method every other is compared with (paired differences and time
    ratios); default the first non-full method. ``figures``: links to show per section (see
    :func:`write_report`). ``seed`` and ``resamples`` drive every bootstrap, so a report is
    reproducible.
    """
    rows_in, more_headers = split_records(rows)
    checked = check_rows(rows_in)
    if not checked:
        raise ValueError("rows: no result rows to report")
    reference = resolve_reference(checked, reference)
    all_headers = [*headers, *more_headers]
    lines = [f"# {title}", "", *run_summary(all_headers)]
    lines += [
        f"{len(checked)} result rows; reference method `{reference}`"
        + (" (the first method that is not the full cache)." if reference == default_reference(checked) else "."),
        "Every accuracy is a mean score with its sample count and a 95% interval: Wilson when all scores are 0 or 1, "
        f"else a percentile bootstrap ({resamples:,} resamples, seed {seed}). "
        f"`{FULL}` is the full cache (nothing evicted): it does not depend on the budget, so its one result per "
        "sample is repeated in every budget column.",
        "",
    ]
    for section, seeded_rows in sections(checked).items():
        model, mode, length = section
        section_rows = over_seeds(seeded_rows)
        lines += [f"## {model} · {mode} · {length} tokens", ""]
        decoding = mode == "decoding"
        lines += budget_fractions(section_rows, decoding=decoding)
        lines += per_task_tables(section_rows, seed=seed, resamples=resamples)
        lines += macro_table(section_rows, seed=seed, resamples=resamples)
        lines += seed_table(seeded_rows)
        lines += suite_tables(section_rows)
        lines += paired_table(section_rows, reference, seed=seed, resamples=resamples)
        lines += time_table(section_rows, reference, decoding=decoding)
        lines += held_table(section_rows) if decoding else []
        lines += figure_lines(list((figures or {}).get(section, ())))
    return "\n".join(lines).rstrip() + "\n"


def resolve_reference(rows: Sequence[Mapping[str, Any]], reference: str | None) -> str:
    """``reference`` checked against the rows' methods, or the default when None."""
    methods = methods_of(rows)
    if reference is None:
        chosen = default_reference(rows)
        assert chosen is not None  # rows are non-empty
        return chosen
    if reference not in methods:
        raise ValueError(f"reference: method {reference!r} has no rows; methods present: {', '.join(methods)}")
    return reference


def write_report(
    rows: Iterable[Mapping[str, Any]],
    headers: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    reference: str | None = None,
    baseline: str | None = None,
    figures: bool = True,
    seed: int = 0,
    resamples: int = 10_000,
) -> Path:
    """Write ``report.md`` and (``figures``) ``figures/*.png`` under ``out_dir``; return the report's path.

    ``baseline``: the method the ablation groups vary, drawn first in each ablation panel
    (default ``lore_kv`` when the rows hold it). Rows are checked before anything is written.
    Figure links are relative to the report, so the folder can be moved as a whole.
    """
    rows_in, more_headers = split_records(rows)
    checked = check_rows(rows_in)
    if not checked:
        raise ValueError("rows: no result rows to report")
    resolve_reference(checked, reference)
    methods = {r["method"] for r in checked}
    if baseline is not None and baseline not in methods:
        present = ", ".join(sorted(methods))
        raise ValueError(f"baseline: method {baseline!r} has no rows; methods present: {present}")
    if baseline is None and "lore_kv" in methods:
        baseline = "lore_kv"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    links: dict[Section, list[tuple[str, str]]] = {}
    if figures:
        from lorekv.eval.figures import section_figures  # matplotlib only when figures are wanted

        for section, section_rows in sections(checked).items():
            averaged = over_seeds(section_rows)
            written = section_figures(
                averaged, out / "figures", section_slug(section), baseline=baseline, seed=seed, resamples=resamples
            )
            links[section] = [(caption, path.relative_to(out).as_posix()) for caption, path in written]
    text = build_report(
        checked, [*headers, *more_headers], reference=reference, figures=links, seed=seed, resamples=resamples
    )
    path = out / "report.md"
    path.write_text(text, encoding="utf-8")
    return path
