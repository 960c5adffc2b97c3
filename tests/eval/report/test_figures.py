"""Figures: each writes a non-empty PNG from synthetic rows, skips what does not apply, refuses mixed sections."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from eval.report.rows import cell_rows, grid, make_row

from lorekv.eval.figures import ablation_bars, accuracy_vs_budget, accuracy_vs_time, keep_map, section_figures
from lorekv.eval.results import encode_keep_map


def assert_png(path: Path | None) -> None:
    assert path is not None and path.exists()
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 2000


def test_accuracy_vs_budget(tmp_path: Path) -> None:
    rows = grid(n=5, labels=("B=32", "B=64", "B=128", "ratio=0.75"))
    out = accuracy_vs_budget(rows, tmp_path / "sub" / "budget.png", resamples=500)
    assert out == tmp_path / "sub" / "budget.png"
    assert_png(out)


def test_accuracy_vs_time(tmp_path: Path) -> None:
    assert_png(accuracy_vs_time(grid(n=5), tmp_path / "time.png", resamples=500))


def test_ablation_bars(tmp_path: Path) -> None:
    rows = grid(n=4, methods=("full", "snapkv"))
    for method, group in (("lore_kv[M=2]", "futures M"), ("lore_kv[M=8]", "futures M"), ("lore_kv[loo]", "scorer")):
        for label in ("B=32", "B=64"):
            rows += cell_rows("niah", method, label, [1, 0, 1, 1], group=group)
    assert_png(ablation_bars(rows, tmp_path / "ablations.png", resamples=500))


def test_ablation_bars_skip_without_groups(tmp_path: Path) -> None:
    assert ablation_bars(grid(n=3), tmp_path / "ablations.png") is None
    assert not (tmp_path / "ablations.png").exists()


def test_keep_map_first_sample_and_smallest_budget(tmp_path: Path) -> None:
    rows = grid(n=3, keep_maps=True)
    assert_png(keep_map(rows, tmp_path / "keep.png"))


def test_keep_map_given_sample(tmp_path: Path) -> None:
    n = 300
    rows = []
    for method in ("snapkv", "lore_kv"):
        for label in ("B=64", "B=16"):
            mask = np.zeros((3, 2, n), bool)
            mask[:, :, -int(label[2:]) :] = True
            mask[:, 0, 120:124] = method == "lore_kv"
            field = encode_keep_map(mask, [0, 2, 5])
            for index in range(2):
                rows.append(make_row(task="niah", index=index, method=method, label=label, length=n,
                                     keep_map=field, gold_positions=[120, 121, 122]))  # fmt: skip
    rows.append(make_row(task="niah", index=0, method="full", label="full", length=n))
    assert_png(keep_map(rows, tmp_path / "keep.png", task="niah", index=1))


def test_keep_map_without_maps_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_map"):
        keep_map(grid(n=2), tmp_path / "keep.png")
    with pytest.raises(ValueError, match="keep_map"):
        keep_map(grid(n=2, keep_maps=True), tmp_path / "keep.png", task="other")


def test_figures_refuse_mixed_sections(tmp_path: Path) -> None:
    rows = grid(n=2) + grid(n=2, length=512)
    with pytest.raises(ValueError, match="one \\(model, mode, length\\) section"):
        accuracy_vs_budget(rows, tmp_path / "x.png")


def test_section_figures_lists_what_it_wrote(tmp_path: Path) -> None:
    written = section_figures(grid(n=3, keep_maps=True), tmp_path, "s", resamples=500)
    assert [caption for caption, _ in written] == ["Accuracy vs budget", "Accuracy vs time", "Keep map"]
    for _, path in written:
        assert_png(path)
