"""How the report figures draw each method: a (colour, marker) pair that depends on its name alone.

A reader compares figures across sections and reports, so a method must look the same in all
of them, whatever other methods a figure holds and in whatever order. Every preset has a fixed
pair of its own (:data:`PRESET_STYLES`: a colour and a marker no other preset uses); the full
cache and the prompt-window control are references, drawn black dashed and grey dotted in
colours no method gets; any other name (an ablation variant such as ``lore_kv[M=1]``, a custom
method) gets a pair chosen by a hash of its name among the pairs no preset uses, so it never
looks like a preset. Two such names whose hashes pick the same pair in one figure are told apart
by :func:`method_styles`, which moves the later name (in sorted order) to the next free pair:
only then does a name's look depend on its company.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from lorekv.eval.rows import FULL

CONTROL = "window_control"
"""The method name the grids give the prompt-window control (``prompt_window`` sampler)."""


@dataclass(frozen=True)
class Style:
    """How one method is drawn.

    Attributes:
        color: a matplotlib colour.
        marker: a matplotlib marker, for lines and points.
        linestyle: the line joining its points ("-" for methods; the references differ).
        hatch: the fill pattern of its bars (bar charts have no markers; the hatch stands in).
    """

    color: str
    marker: str
    linestyle: str = "-"
    hatch: str = ""


COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#bcbd22", "#17becf", "#393b79", "#e7ba52", "#637939", "#7b4173", "#843c39", "#6b6ecf",
    "#31a354", "#a55194", "#3182bd", "#e6550d",
)  # fmt: skip
"""Method colours: matplotlib's tab10 without its grey, then six of tab20b (indigo, gold, olive,
plum, brick, periwinkle), one of tab20c (green), one of tab20b (orchid), one of tab20c (blue)
and one of tab20c (orange); black and grey are left to the references."""

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p", "d", "8", "H", "x", "+", "1", "2")
HATCHES = (
    "",
    "//",
    "\\\\",
    "xx",
    "..",
    "oo",
    "++",
    "--",
    "||",
    "**",
    "OO",
    "/.",
    "\\.",
    "x.",
    "o.",
    "-.",
    "+.",
    "|.",
    "*.",
)
"""The bar hatch that goes with each marker (same position)."""

PRESET_ORDER = (
    "lore_kv", "snapkv", "pyramidkv", "ada_kv", "tova", "streaming_llm", "greedy_lookahead",
    "laq", "h2o", "critical_kv", "kvzip", "knorm", "random", "lore_kv_agnostic", "expected_attention",
    "kvzip_plus", "kvzap", "lore_kv_fast", "rkv",
)  # fmt: skip
"""The presets in the order they were given styles: a new preset is appended, never inserted,
so that no existing preset changes its look."""


def _style(color: int, marker: int) -> Style:
    return Style(COLORS[color], MARKERS[marker], hatch=HATCHES[marker])


PRESET_STYLES: dict[str, Style] = {name: _style(i, i) for i, name in enumerate(PRESET_ORDER)}
"""Each preset's colour and marker, both different from every other preset's."""

REFERENCE_STYLES: dict[str, Style] = {
    FULL: Style("black", "o", linestyle="--", hatch=""),
    CONTROL: Style("#7f7f7f", "x", linestyle=":", hatch=".."),
}
"""The full cache and the prompt-window control: colours no method is given."""

_TAKEN = {(s.color, s.marker) for s in PRESET_STYLES.values()}
FREE = tuple(
    _style(c, m) for m in range(len(MARKERS)) for c in range(len(COLORS)) if (COLORS[c], MARKERS[m]) not in _TAKEN
)
"""The pairs left for other names (156 of 13 x 13)."""


def _hashed(name: str) -> int:
    """A position in :data:`FREE` from the name: the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % len(FREE)


def style_of(method: str) -> Style:
    """The style ``method`` gets wherever it appears without a colliding custom name."""
    known = REFERENCE_STYLES.get(method) or PRESET_STYLES.get(method)
    return known if known is not None else FREE[_hashed(method)]


def method_styles(methods: Iterable[str]) -> dict[str, Style]:
    """One style per method of one figure, no two alike (see the module docstring for the rule)."""
    names = list(dict.fromkeys(methods))
    styles = {m: style_of(m) for m in names if m in REFERENCE_STYLES or m in PRESET_STYLES}
    custom = sorted(m for m in names if m not in styles)
    if len(custom) > len(FREE):
        raise ValueError(f"methods: at most {len(FREE)} names beyond the presets per figure, got {len(custom)}")
    used: set[int] = set()
    for method in custom:
        slot = _hashed(method)
        while slot in used:
            slot = (slot + 1) % len(FREE)
        used.add(slot)
        styles[method] = FREE[slot]
    return {m: styles[m] for m in names}


__all__ = ["CONTROL", "PRESET_STYLES", "REFERENCE_STYLES", "Style", "method_styles", "style_of"]
