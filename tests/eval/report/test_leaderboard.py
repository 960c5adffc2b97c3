"""The leaderboard: the best method and the methods tied with it at each budget, ranking, cost, the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eval.report.rows import cell_rows, grid, make_row

from lorekv.eval.leaderboard import (
    build_leaderboard,
    leaderboard_command,
    prefill_multiple,
    ranking,
    standings,
    write_leaderboard,
)
from lorekv.eval.stats import macro_paired_difference


def three_methods(n: int = 20) -> list[dict[str, Any]]:
    """`strong` answers every sample, `close` all but two, `weak` none; the full cache every one."""
    rows = cell_rows("niah", "full", "full", [1.0] * n)
    for label in ("B=32", "B=64"):
        rows += cell_rows("niah", "weak", label, [0.0] * n)
        rows += cell_rows("niah", "close", label, [0.0, 0.0] + [1.0] * (n - 2))
        rows += cell_rows("niah", "strong", label, [1.0] * n)
    return rows


def test_the_best_and_the_methods_tied_with_it_by_the_paired_evidence() -> None:
    """close loses 2 of 20 pairs to strong (sign test p = 0.5: tied); weak loses all 20 (a finding)."""
    table, best = standings(three_methods(), resamples=1000)
    assert best == {"B=32": "strong", "B=64": "strong"}
    assert table[("strong", "B=32")].tied and table[("strong", "B=32")].to_best is None
    close, weak = table[("close", "B=32")], table[("weak", "B=32")]
    assert close.tied and not close.to_best.significant and close.to_best.mean == pytest.approx(-0.1)
    assert not weak.tied and weak.to_best.significant and weak.to_best.mean == pytest.approx(-1.0)
    assert not table[("full", "full")].tied


def test_a_bootstrap_interval_below_zero_is_not_enough_to_fall_behind() -> None:
    """4 losses and no win in 20 pairs: the bootstrap interval excludes 0 but the exact sign test gives
    p = 0.125, so the method stays tied with the best (as the report's paired table says)."""
    rows = cell_rows("niah", "best", "B=32", [1.0] * 20) + cell_rows("niah", "few", "B=32", [0.0] * 4 + [1.0] * 16)
    table, _ = standings(rows, resamples=2000)
    diff = table[("few", "B=32")].to_best
    assert diff.hi < 0 and diff.p_sign > 0.05 and table[("few", "B=32")].tied


def test_the_best_is_chosen_by_the_macro_mean_and_compared_by_a_macro_difference() -> None:
    """Pooled over samples `b` leads (19/22 against 4/22); per task `a` leads (mean 0.6 against 0.45)."""
    rows = cell_rows("t1", "a", "B=32", [1.0, 1.0]) + cell_rows("t1", "b", "B=32", [0.0, 0.0])
    rows += cell_rows("t2", "a", "B=32", [1.0] * 4 + [0.0] * 16) + cell_rows("t2", "b", "B=32", [1.0] * 19 + [0.0])
    table, best = standings(rows, resamples=1000)
    assert best["B=32"] == "a"
    expected = macro_paired_difference(
        {"t1": [0.0, 0.0], "t2": [1.0] * 19 + [0.0]}, {"t1": [1.0, 1.0], "t2": [1.0] * 4 + [0.0] * 16}, resamples=1000
    )
    assert table[("b", "B=32")].to_best == expected
    assert expected.mean == pytest.approx((-1.0 + 0.75) / 2)


def test_differences_pair_only_the_samples_both_methods_answered() -> None:
    rows = cell_rows("niah", "a", "B=32", [1.0] * 10) + cell_rows("niah", "b", "B=32", [1.0] * 6 + [0.0] * 4)
    rows = [r for r in rows if not (r["method"] == "b" and r["index"] >= 6)]  # b answered the first 6 only
    table, _ = standings(rows, resamples=1000)
    diff = table[("b", "B=32")].to_best
    assert diff.n == 6 and diff.mean == 0.0


def test_ranking_puts_the_full_cache_first_then_the_best_mean_over_budgets() -> None:
    rows = three_methods()
    table, _ = standings(rows, resamples=1000)
    assert ranking(rows, {cell: standing.stats for cell, standing in table.items()}) == [
        "full",
        "strong",
        "close",
        "weak",
    ]


def test_prefill_multiple_is_the_median_ratio_to_the_same_prompts_prefill() -> None:
    rows = [make_row(index=i, method="a", seconds=s) for i, s in enumerate([2.0, 3.0, 10.0])]
    assert prefill_multiple(rows, "a") is None
    for row, floor in zip(rows, [1.0, 1.0, 2.0], strict=True):
        row["seconds"]["reference_prefill"] = floor
    assert prefill_multiple(rows, "a") == 3.0  # median of 2, 3, 5


def test_the_page_bolds_what_the_evidence_allows_and_states_its_counts() -> None:
    rows = three_methods()
    for row in rows:
        row["seconds"]["reference_prefill"] = 0.5
    text = build_leaderboard(rows, [{"type": "header", "machine": {"cores": 2}}], resamples=1000)
    lines = text.split("**Difference to the best")[0].splitlines()
    accuracy = {line.split(" | ")[0].strip("| `"): line for line in lines if line.startswith("| `")}
    assert "**1.00 [" in accuracy["strong"] and "**0.90 [" in accuracy["close"]
    assert "**" not in accuracy["weak"].split(" | ", 2)[2] and "2.00x" in accuracy["weak"]
    assert "20 samples over 1 task: niah (20)" in text
    assert "| `strong` | best | best |" in text and "-1.00 [-1.00, -1.00] *" in text
    assert "B=32 (12.5%)" in text  # B / candidates of the synthetic prompt of 256 tokens
    assert "machine: cores 2" in text
    assert build_leaderboard(rows, resamples=1000) == build_leaderboard(rows, resamples=1000)


def test_one_section_per_setting_each_with_its_figure(tmp_path: Path) -> None:
    rows = grid(n=6, seed=1) + grid(n=6, seed=2, mode="query_agnostic")
    page = write_leaderboard(rows, [], tmp_path, source="lorekv report --leaderboard", resamples=500)
    text = page.read_text()
    assert text.count("\n## tiny · ") == 2 and "query-aware" in text and "query-agnostic" in text
    links = [line[line.index("(") + 1 : -1] for line in text.splitlines() if line.startswith("![")]
    assert len(links) == 2 and all((tmp_path / link).stat().st_size > 10_000 for link in links)
    assert "Generated by `lorekv report --leaderboard`" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_rows_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    rows = grid(n=2)
    rows[0]["score"] = 2.0
    with pytest.raises(ValueError, match="scores lie in"):
        write_leaderboard(rows, [], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line_writes_the_leaderboard_it_cites(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lorekv.cli import app

    results = tmp_path / "results.jsonl"
    rows = grid(n=4, tasks=("niah",))
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    out = tmp_path / "board"
    done = runner.invoke(app, ["report", "--leaderboard", "--no-figures", "--out", str(out), str(results)])
    assert done.exit_code == 0, done.output
    text = (out / "leaderboard.md").read_text()
    assert f"`{leaderboard_command([results], out)}`" in text
    refused = runner.invoke(app, ["report", "--leaderboard", "--reference", "snapkv", str(results)])
    assert refused.exit_code != 0 and "reference" in refused.output and "drop --reference" in refused.output


def test_seeded_methods_are_ranked_by_their_mean_over_seeds() -> None:
    rows = []
    for seed, scores in ((0, [1.0] * 10), (1, [0.0] * 10)):
        for row in cell_rows("niah", "sampled", "B=32", scores):
            rows.append({**row, "sampler_seed": seed, "id": f"{row['id']}|{seed}"})
    rows += cell_rows("niah", "steady", "B=32", [1.0] * 6 + [0.0] * 4)
    text = build_leaderboard(rows, resamples=500)
    assert "| `steady` | — | **0.60" in text and "`sampled` | — | **0.50" in text
