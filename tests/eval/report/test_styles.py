"""Method styles: every method in a figure looks different, a method looks the same in every figure
and report, and the references (full cache, prompt-window control) look like no method."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from eval.report.rows import cell_rows, grid
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from lorekv.eval import figures
from lorekv.eval.rows import FULL
from lorekv.eval.styles import CONTROL, FREE, PRESET_STYLES, REFERENCE_STYLES, Style, method_styles, style_of
from lorekv.presets import PRESETS

CUSTOM = ("lore_kv[M=1]", "lore_kv[M=8]", "lore_kv[loo]", "lore_kv[T=4]", "my_scorer", "snapkv w=64")
EVERYTHING = (*PRESETS, FULL, CONTROL, *CUSTOM)


def pairs(styles: dict[str, Style]) -> list[tuple[str, str]]:
    return [(s.color, s.marker) for s in styles.values()]


def test_every_method_of_a_figure_gets_its_own_colour_and_marker() -> None:
    styles = method_styles(EVERYTHING)
    assert list(styles) == list(EVERYTHING)
    assert len(set(pairs(styles))) == len(EVERYTHING)
    assert len({(s.color, s.hatch) for s in styles.values()}) == len(EVERYTHING), "bars differ too"


def test_every_preset_has_a_style_of_its_own() -> None:
    assert set(PRESETS) <= set(PRESET_STYLES), "a new preset needs an entry at the end of PRESET_ORDER"
    assert len({s.color for s in PRESET_STYLES.values()}) == len(PRESET_STYLES)
    assert len({s.marker for s in PRESET_STYLES.values()}) == len(PRESET_STYLES)
    assert PRESET_STYLES["lore_kv"] == Style("#1f77b4", "o"), "a preset's look never changes between releases"


def test_a_method_looks_the_same_whatever_its_company() -> None:
    one = method_styles(["lore_kv", "snapkv", "lore_kv[M=1]", FULL, "my_scorer"])
    other = method_styles(["my_scorer", "random", FULL, "greedy_lookahead", "lore_kv[M=1]", "lore_kv", CONTROL])
    for method in set(one) & set(other):
        assert one[method] == other[method] == style_of(method), method


def test_custom_names_never_take_a_preset_or_reference_look() -> None:
    taken = {(s.color, s.marker) for s in (*PRESET_STYLES.values(), *REFERENCE_STYLES.values())}
    assert all((s.color, s.marker) not in taken for s in FREE)
    assert all((style_of(f"custom-{i}").color, style_of(f"custom-{i}").marker) not in taken for i in range(300))


def colliding_names() -> tuple[str, str]:
    """Two custom names whose hashes pick the same style."""
    seen: dict[Style, str] = {}
    for i in range(10_000):
        name = f"variant[{i}]"
        if (style := style_of(name)) in seen:
            return seen[style], name
        seen[style] = name
    raise AssertionError("no two names collide")


def test_custom_names_whose_hashes_collide_are_told_apart() -> None:
    first, second = colliding_names()
    styles = method_styles([second, first, "lore_kv"])
    assert styles[first] != styles[second]
    assert styles[min(first, second)] == style_of(first), "the first in sorted order keeps its own look"
    many = method_styles(f"m{i}" for i in range(len(FREE)))
    assert len(set(pairs(many))) == len(FREE)
    with pytest.raises(ValueError, match="methods"):
        method_styles(f"m{i}" for i in range(len(FREE) + 1))


def test_the_references_look_like_no_method() -> None:
    full, control = REFERENCE_STYLES[FULL], REFERENCE_STYLES[CONTROL]
    assert (full.color, full.linestyle) == ("black", "--") and (control.color, control.linestyle) == ("#7f7f7f", ":")
    methods = [*PRESET_STYLES.values(), *FREE]
    for reference in (full, control):
        assert all(s.color != reference.color and s.linestyle != reference.linestyle for s in methods)
    assert full.color != control.color and full.linestyle != control.linestyle


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the figure functions draw, kept open instead of closed after saving."""
    kept: list[Figure] = []

    def save(fig: Figure, path: str | Path) -> Path:
        kept.append(fig)
        return Path(path)

    monkeypatch.setattr(figures, "_save", save)
    yield kept
    for fig in kept:
        plt.close(fig)


def legend_styles(fig: Figure) -> dict[str, tuple[str, str]]:
    """(colour, marker or hatch) of each legend entry of the figure's axes, as drawn."""
    from matplotlib.container import BarContainer, ErrorbarContainer

    out = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if isinstance(handle, BarContainer):
                patch = handle.patches[0]
                out[label] = (to_hex(patch.get_facecolor()), patch.get_hatch() or "")
            else:
                line = handle[0] if isinstance(handle, ErrorbarContainer) else handle
                out[label] = (to_hex(line.get_color()), line.get_marker())
    return out


def test_figures_draw_each_method_in_its_style_in_every_report(drawn: list[Figure], tmp_path: Path) -> None:
    first = grid(n=3, methods=("full", "lore_kv", "greedy_lookahead", "snapkv", CONTROL))
    second = grid(n=3, methods=("full", "greedy_lookahead", "lore_kv[M=1]", "lore_kv", "random"))
    for rows in (first, second):
        figures.accuracy_vs_budget(rows, tmp_path / "b.png", resamples=200)
        figures.accuracy_vs_time(rows, tmp_path / "t.png", resamples=200)
    lines = [legend_styles(fig) for fig in drawn]
    for seen in lines:
        for method, (color, marker) in seen.items():
            if method == f"{FULL} cache":  # the budget plot's full-cache line
                assert color == "#000000"
                continue
            assert (color, marker) == (to_hex(style_of(method).color), style_of(method).marker), method
        assert len(set(seen.values())) == len(seen)
    assert lines[0]["lore_kv"] == lines[3]["lore_kv"], "one method, two reports, two figure kinds: one look"

    rows = grid(n=4, methods=("full", "lore_kv"))
    for method, group in (("lore_kv[M=2]", "futures M"), ("lore_kv[M=8]", "futures M"), ("lore_kv[loo]", "scorer")):
        rows += cell_rows("niah", method, "B=32", [1, 0, 1, 1], group=group)
    figures.ablation_bars(rows, tmp_path / "a.png", baseline="lore_kv", resamples=200)
    bars = legend_styles(drawn[-1])
    assert set(bars) == {"lore_kv", "lore_kv[M=2]", "lore_kv[M=8]", "lore_kv[loo]"}
    for method, (color, hatch) in bars.items():
        assert (color, hatch) == (style_of(method).color, style_of(method).hatch), method
