"""Figures of a grid run (matplotlib, Agg backend): accuracy against budget and time, ablations, keep maps.

Each function draws the rows of ONE (model, mode, length) section into one PNG and returns its
path; :func:`section_figures` draws all that apply for the report. Accuracies are macro means
with their 95% intervals, computed as in the report (:func:`lorekv.eval.rows.macro_cells`). Each
method has its own colour and marker, the same in every figure and report
(:mod:`lorekv.eval.styles`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lorekv.extras import require

matplotlib = require("matplotlib", extra="plots", what="report figures")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from lorekv.eval.results import decode_keep_map  # noqa: E402
from lorekv.eval.rows import (  # noqa: E402
    FULL,
    CellStats,
    budget_labels,
    budget_value,
    check_rows,
    kept_fraction,
    macro_cells,
    median_seconds,
    methods_of,
    sections,
)
from lorekv.eval.styles import REFERENCE_STYLES, method_styles  # noqa: E402

DPI = 120
"""Resolution of every figure: sharp on screen, small on disk."""


def _one_section(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows, checked, all of one (model, mode, length) section: figures never mix sections."""
    checked = check_rows(rows)
    if not checked:
        raise ValueError("rows: no result rows to draw")
    found = list(sections(checked))
    if len(found) != 1:
        raise ValueError(f"rows: one (model, mode, length) section per figure, got {len(found)}: {found}")
    return checked


def _section_title(rows: Sequence[Mapping[str, Any]]) -> str:
    row = rows[0]
    return f"{row['model']} · {row['mode']} · {row['length']} tokens"


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return out


def _yerr(stats: Sequence[CellStats]) -> np.ndarray:
    """Asymmetric error bars (2, k) from means and interval bounds."""
    return np.array([[s.mean - s.lo for s in stats], [s.hi - s.mean for s in stats]])


def _full_cache_line(ax: Any, cells: Mapping[tuple[str, str], CellStats]) -> None:
    """The full cache's accuracy as a dashed line with its 95% band, when the cells hold it."""
    full = cells.get((FULL, FULL))
    if full is not None:
        ref = REFERENCE_STYLES[FULL]
        ax.axhline(full.mean, color=ref.color, linestyle=ref.linestyle, linewidth=1.2, label=f"{FULL} cache")
        ax.axhspan(full.lo, full.hi, color=ref.color, alpha=0.06)


def _accuracy_axes(ax: Any, title: str) -> None:
    """The y axis, grid, title and legend shared by the accuracy-against-budget figures."""
    ax.set_ylabel("accuracy (macro over tasks)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _is_ratio(rows: Sequence[Mapping[str, Any]], label: str) -> bool:
    return any(r["budget_label"] == label and r.get("ratio") is not None for r in rows)


def accuracy_vs_budget(
    rows: Sequence[Mapping[str, Any]], path: str | Path, *, seed: int = 0, resamples: int = 10_000
) -> Path:
    """Macro accuracy against budget B (log2 axis) per method, 95% band; the full cache dashed.

    Fixed budgets (B=...) are joined by a line; ratio budgets are hollow markers at the median
    B they gave over the section's prompts (prompts differ in length, so they are not on the line).
    """
    rows = _one_section(rows)
    cells = macro_cells(rows, seed=seed, resamples=resamples)
    labels = budget_labels(rows)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = method_styles(methods_of(rows))
    for method in (m for m in methods_of(rows) if m != FULL):
        style = styles[method]
        color = style.color
        fixed_labels = [lab for lab in labels if (method, lab) in cells and not _is_ratio(rows, lab)]
        fixed = sorted(((budget_value(rows, lab), cells[(method, lab)]) for lab in fixed_labels), key=lambda p: p[0])
        if fixed:
            x, stats = [p[0] for p in fixed], [p[1] for p in fixed]
            ax.plot(
                x, [s.mean for s in stats], marker=style.marker, linestyle=style.linestyle, color=color, label=method
            )
            ax.fill_between(x, [s.lo for s in stats], [s.hi for s in stats], color=color, alpha=0.15)
        for label in (lab for lab in labels if (method, lab) in cells and _is_ratio(rows, lab)):
            s = cells[(method, label)]
            ax.errorbar(
                [budget_value(rows, label)],
                [s.mean],
                yerr=_yerr([s]),
                fmt=style.marker,
                mfc="white",
                color=color,
                capsize=3,
                label=None if fixed else method,
            )
            ax.annotate(
                label,
                (budget_value(rows, label), s.mean),
                textcoords="offset points",
                xytext=(5, -10),
                fontsize=7,
                color=color,
            )
    _full_cache_line(ax, cells)
    ax.set_xscale("log", base=2)
    ticks = sorted({budget_value(rows, label) for label in labels})
    if ticks:
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel("budget B (kept prompt entries per KV head; hollow: ratio budgets at their median B)")
    _accuracy_axes(ax, f"Accuracy vs budget — {_section_title(rows)}\n(bands: 95% intervals)")
    return _save(fig, path)


def accuracy_vs_kept_fraction(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    order: Sequence[str] | None = None,
    seed: int = 0,
    resamples: int = 10_000,
) -> Path:
    """The leaderboard's figure: macro accuracy against the kept fraction of the prompt (log axis),
    a line through every budget column of a method (fixed budgets and ratios alike, each at its
    median kept fraction), the full cache a dashed line with its 95% band. The methods' intervals
    are in the leaderboard's table: a dozen overlapping bands would hide the lines.

    ``order``: the methods in legend order (default: order of appearance).
    """
    rows = _one_section(rows)
    cells = macro_cells(rows, seed=seed, resamples=resamples)
    labels = budget_labels(rows)
    fraction = {label: kept_fraction(rows, label) for label in labels}
    methods = [m for m in (order or methods_of(rows)) if m != FULL]
    styles = method_styles(methods_of(rows))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for method in methods:
        points = sorted((fraction[lab], cells[(method, lab)]) for lab in labels if (method, lab) in cells)
        if not points:
            continue
        x, stats = [p[0] for p in points], [p[1] for p in points]
        style = styles[method]
        ax.plot(
            x, [s.mean for s in stats], marker=style.marker, linestyle=style.linestyle, color=style.color, label=method
        )
    _full_cache_line(ax, cells)
    ax.set_xscale("log")
    ticks = sorted(set(fraction.values()))
    if ticks:
        ax.set_xticks(ticks, [f"{t:.1%}" for t in ticks], rotation=45)
        ax.minorticks_off()
    ax.set_xlabel("kept fraction of the prompt (median over samples; log axis)")
    _accuracy_axes(ax, f"Accuracy vs kept fraction — {_section_title(rows)}\n(band: the full cache's 95% interval)")
    return _save(fig, path)


def ablation_bars(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    baseline: str | None = None,
    seed: int = 0,
    resamples: int = 10_000,
) -> Path | None:
    """One panel per ablation group: macro accuracy of each of its methods at each budget, 95% error bars.

    ``baseline`` (the method the ablations vary, e.g. ``lore_kv``) is drawn first in every
    panel, at the group's budgets. Returns None (and writes nothing) when no row has a group.
    """
    rows = _one_section(rows)
    groups = list(dict.fromkeys(str(r["group"]) for r in rows if r.get("group")))
    if not groups:
        return None
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    styles = method_styles(methods_of(rows))
    for ax, group in zip(axes[:, 0], groups, strict=True):
        group_rows = [r for r in rows if r.get("group") == group]
        budgets = {r["budget_label"] for r in group_rows}
        group_rows = [r for r in rows if r["method"] == baseline and r["budget_label"] in budgets] + group_rows
        cells = macro_cells(group_rows, seed=seed, resamples=resamples)
        labels = budget_labels(group_rows)
        methods = [m for m in methods_of(group_rows) if m != FULL]
        width = 0.8 / max(1, len(methods))
        for k, method in enumerate(methods):
            at = [i for i, label in enumerate(labels) if (method, label) in cells]
            stats = [cells[(method, labels[i])] for i in at]
            x = np.array(at) + (k - (len(methods) - 1) / 2) * width
            style = styles[method]
            ax.bar(
                x, [s.mean for s in stats], width, yerr=_yerr(stats), capsize=3, label=method,
                color=style.color, hatch=style.hatch, edgecolor="white", linewidth=0,
            )  # fmt: skip
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("accuracy (macro)")
        ax.set_title(f"Ablation: {group}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[-1, 0].set_xlabel("budget")
    fig.suptitle(f"{_section_title(rows)} (error bars: 95% intervals)")
    fig.tight_layout()
    return _save(fig, path)


def accuracy_vs_time(
    rows: Sequence[Mapping[str, Any]], path: str | Path, *, seed: int = 0, resamples: int = 10_000
) -> Path:
    """Macro accuracy against median compression seconds, one labeled point per (method, budget)."""
    rows = _one_section(rows)
    cells = macro_cells(rows, seed=seed, resamples=resamples)
    seconds = median_seconds(rows)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = method_styles(methods_of(rows))
    for method in methods_of(rows):
        keys = [cell for cell in cells if cell[0] == method]
        stats = [cells[c] for c in keys]
        x = [seconds[c] for c in keys]
        style = styles[method]
        ax.errorbar(
            x, [s.mean for s in stats], yerr=_yerr(stats), fmt=style.marker, color=style.color, capsize=3, label=method
        )
        for cell, xi, s in zip(keys, x, stats, strict=True):
            ax.annotate(cell[1], (xi, s.mean), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("median compression seconds per sample (prefill + sampling + scoring + selection)")
    ax.set_ylabel("accuracy (macro over tasks)")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Accuracy vs compression time — {_section_title(rows)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(fig, path)


def _keep_map_sample(rows: Sequence[Mapping[str, Any]], task: str | None, index: int | None) -> list[dict[str, Any]]:
    """Rows with a keep map of one sample (the given one, else the first), at its smallest budget."""
    mapped = [r for r in rows if r.get("keep_map")]
    if task is not None:
        mapped = [r for r in mapped if r["task"] == task]
    if index is not None:
        mapped = [r for r in mapped if r["index"] == index]
    if not mapped:
        raise ValueError(f"rows: no keep_map for task={task!r}, index={index!r}")
    first = mapped[0]
    sample = [r for r in mapped if (r["task"], r["index"]) == (first["task"], first["index"])]
    smallest = min(sample, key=lambda r: (r["budget"] is None, r["budget"] or 0))["budget_label"]
    return [r for r in sample if r["budget_label"] == smallest]


def keep_map(
    rows: Sequence[Mapping[str, Any]], path: str | Path, *, task: str | None = None, index: int | None = None
) -> Path:
    """Which prompt entries each method kept, for one sample, at its smallest budget with keep maps.

    One panel per method: rows are (layer, head) pairs, columns prompt positions, kept entries
    dark; the gold answer's positions are marked in red along the top and as faint lines.
    """
    rows = _one_section(rows)
    sample = _keep_map_sample(rows, task, index)
    fig, axes = plt.subplots(len(sample), 1, figsize=(10, 1.2 + 2.2 * len(sample)), squeeze=False)
    for ax, row in zip(axes[:, 0], sample, strict=True):
        layers, mask = decode_keep_map(row["keep_map"])
        n_layers, heads, n = mask.shape
        ax.imshow(
            mask.reshape(n_layers * heads, n), aspect="auto", cmap="Greys", vmin=0, vmax=1,
            extent=(-0.5, n - 0.5, n_layers * heads - 0.5, -0.5),
        )  # fmt: skip
        step = max(1, n_layers // 8)
        ax.set_yticks(
            [i * heads for i in range(0, n_layers, step)], [f"L{layers[i]}" for i in range(0, n_layers, step)]
        )
        for boundary in range(1, n_layers):
            ax.axhline(boundary * heads - 0.5, color="tab:blue", linewidth=0.3, alpha=0.5)
        gold = [p for p in (row.get("gold_positions") or []) if 0 <= p < n]
        for p in gold:
            ax.axvline(p, color="tab:red", linewidth=0.6, alpha=0.35)
        if gold:
            ax.plot(gold, [-0.5] * len(gold), "v", color="tab:red", markersize=6, clip_on=False, label="gold answer")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
        ax.set_ylabel(f"layer × {heads} heads")
        ax.set_title(f"{row['method']} · {row['budget_label']} · score {row['score']:.2f}", fontsize=10, pad=10)
    axes[-1, 0].set_xlabel("prompt position (tokens)")
    first = sample[0]
    fig.suptitle(f"Kept entries (dark) — {_section_title(rows)}\ntask {first['task']}, sample {first['index']}")
    fig.tight_layout()
    return _save(fig, path)


def section_figures(
    rows: Sequence[Mapping[str, Any]],
    directory: str | Path,
    slug: str,
    *,
    baseline: str | None = None,
    seed: int = 0,
    resamples: int = 10_000,
) -> list[tuple[str, Path]]:
    """Every figure that applies to one section's rows, as (caption, path) under ``directory``."""
    directory = Path(directory)
    out = [
        (
            "Accuracy vs budget",
            accuracy_vs_budget(rows, directory / f"{slug}-budget.png", seed=seed, resamples=resamples),
        ),
        ("Accuracy vs time", accuracy_vs_time(rows, directory / f"{slug}-time.png", seed=seed, resamples=resamples)),
    ]
    ablation = ablation_bars(
        rows, directory / f"{slug}-ablations.png", baseline=baseline, seed=seed, resamples=resamples
    )
    if ablation is not None:
        out.append(("Ablations", ablation))
    if any(r.get("keep_map") for r in rows):
        out.append(("Keep map", keep_map(rows, directory / f"{slug}-keep-map.png")))
    return out


__all__ = [
    "ablation_bars",
    "accuracy_vs_budget",
    "accuracy_vs_kept_fraction",
    "accuracy_vs_time",
    "keep_map",
    "section_figures",
]
