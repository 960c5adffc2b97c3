"""The Markdown report: numbers against hand computation, pairing, ordering, full cache, errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from eval.report.rows import cell_rows, grid, make_row

from lorekv.eval.report import build_report, write_report
from lorekv.eval.results import decode_keep_map, encode_keep_map
from lorekv.eval.rows import check_rows, split_records

SEVEN_OF_TEN = [1.0] * 7 + [0.0] * 3


def section_of(text: str, heading: str) -> str:
    """The text from ``heading`` up to the next heading of the same or higher level."""
    start = text.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = re.search(rf"^#{{1,{level}}} ", text[start + len(heading) :], flags=re.M)
    return text[start : start + len(heading) + end.start()] if end else text[start:]


def table_row(text: str, method: str) -> list[str]:
    """The cells of the first table line of ``method`` (method cell dropped)."""
    line = next(line for line in text.splitlines() if line.startswith(f"| `{method}`"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_seven_of_ten_shows_wilson_interval_and_count() -> None:
    rows = cell_rows("niah", "snapkv", "B=64", SEVEN_OF_TEN)
    text = build_report(rows)
    per_task = section_of(text, "### Accuracy per task")
    assert "**niah** (n = 10 samples per cell)" in per_task
    assert table_row(per_task, "snapkv") == ["0.70 [0.40, 0.89]"]


def test_fractional_scores_use_the_bootstrap_and_the_stated_seed() -> None:
    rows = cell_rows("qa", "snapkv", "B=64", [0.2, 0.5, 0.9, 0.4])
    text = build_report(rows, resamples=2000, seed=5)
    assert "(2,000 resamples, seed 5)" in text
    cell = table_row(section_of(text, "### Accuracy per task"), "snapkv")[0]
    assert cell.startswith("0.50 [")
    assert build_report(rows, resamples=2000, seed=5) == text


def test_full_cache_fills_every_budget_column() -> None:
    rows = cell_rows("niah", "full", "full", SEVEN_OF_TEN)
    rows += cell_rows("niah", "snapkv", "B=32", [1.0] * 2 + [0.0] * 8)
    rows += cell_rows("niah", "snapkv", "B=64", [1.0] * 5 + [0.0] * 5)
    text = build_report(rows)
    per_task = section_of(text, "### Accuracy per task")
    assert "| method | B=32 | B=64 |" in per_task
    assert table_row(per_task, "full") == ["0.70 [0.40, 0.89]"] * 2
    assert "`full` (full cache)" in per_task
    assert table_row(per_task, "snapkv") == ["0.20 [0.06, 0.51]", "0.50 [0.24, 0.76]"]


def test_macro_is_the_mean_of_task_means_with_counts() -> None:
    rows = cell_rows("a", "snapkv", "B=64", [1.0] * 4) + cell_rows("b", "snapkv", "B=64", [1.0] * 5 + [0.0] * 5)
    rows += cell_rows("a", "tova", "B=64", [1.0] * 4)
    macro = section_of(build_report(rows), "### Averaged over tasks")
    assert table_row(macro, "snapkv")[0].startswith("0.75 [")
    assert "n = 14 samples, 2 tasks per cell unless the cell states its own" in macro
    assert "(n=" not in table_row(macro, "snapkv")[0]
    assert table_row(macro, "tova") == ["1.00 [0.51, 1.00] (n=4, 1 task)"]


def test_macro_states_a_uniform_count_once() -> None:
    macro = section_of(build_report(grid(n=6)), "### Averaged over tasks")
    assert "n = 12 samples, 2 tasks per cell" in macro
    assert "(n=" not in macro


def test_paired_differences_sign_counts_and_default_reference() -> None:
    ref = [1, 1, 1, 1, 1, 0, 0, 1, 0, 0]
    better = [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]  # wins at 5, 6, 8; no loss
    worse = [1, 1, 0, 0, 0, 0, 0, 1, 0, 0]  # loses at 2, 3, 4
    rows = cell_rows("t", "full", "full", [1] * 10)
    rows += cell_rows("t", "snapkv", "B=64", ref) + cell_rows("t", "lore_kv", "B=64", better)
    rows += cell_rows("t", "tova", "B=64", worse)
    text = build_report(rows)
    assert "reference method `snapkv` (the first method that is not the full cache)" in text
    paired = section_of(text, "### Paired differences to `snapkv`")
    assert (
        table_row(paired, "lore_kv")[0].startswith("+0.30 [")
        and "3/0/7 p=0.25 (n=10)" in table_row(paired, "lore_kv")[0]
    )
    assert table_row(paired, "tova")[0].startswith("-0.30 [") and "0/3/7" in table_row(paired, "tova")[0]
    assert table_row(paired, "full")[0].startswith("+0.40 [") and "4/0/6" in table_row(paired, "full")[0]
    assert "`snapkv`" not in [line.split("|")[1].strip() for line in paired.splitlines() if line.startswith("|")]


def test_paired_differences_use_only_shared_samples() -> None:
    rows = cell_rows("t", "snapkv", "B=64", [0, 0, 0, 0]) + cell_rows("t", "lore_kv", "B=64", [1, 1])
    rows += [make_row(task="u", index=0, method="lore_kv", score=1.0)]  # no snapkv row for task u
    paired = section_of(build_report(rows), "### Paired differences")
    assert table_row(paired, "lore_kv")[0].endswith("2/0/0 p=0.5 (n=2)")


def test_reference_may_be_the_full_cache() -> None:
    rows = cell_rows("t", "full", "full", [1, 1, 1, 1]) + cell_rows("t", "snapkv", "B=32", [1, 0, 0, 0])
    rows += cell_rows("t", "snapkv", "B=64", [1, 1, 0, 0])
    paired = section_of(build_report(rows, reference="full"), "### Paired differences to `full`")
    assert [c.split(" [")[0] for c in table_row(paired, "snapkv")] == ["-0.75", "-0.50"]


def test_missing_reference_is_named() -> None:
    with pytest.raises(ValueError, match=r"reference: method 'h2o' has no rows"):
        build_report(cell_rows("t", "snapkv", "B=64", [1, 0]), reference="h2o")
    with pytest.raises(ValueError, match="reference"):
        write_report(cell_rows("t", "snapkv", "B=64", [1, 0]), [], "/nonexistent/never", reference="h2o")


def test_duplicate_rows_are_an_error() -> None:
    rows = cell_rows("t", "snapkv", "B=64", [1, 0]) + [make_row(task="t", index=1, method="snapkv", score=1.0)]
    with pytest.raises(ValueError, match=r"duplicate .*task='t', index=1, method='snapkv', budget_label='B=64'"):
        build_report(rows)


def test_same_sample_in_another_section_is_not_a_duplicate() -> None:
    rows = cell_rows("t", "snapkv", "B=64", [1, 0]) + cell_rows("t", "snapkv", "B=64", [1, 0], mode="query_agnostic")
    assert len(check_rows(rows)) == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [({"score": 1.5}, "score 1.5"), ({"method": "full"}, "full cache"), ({"budget_label": "full"}, "full cache")],
)
def test_bad_rows_are_named(change: dict, message: str) -> None:
    row = make_row() | change
    with pytest.raises(ValueError, match=message):
        check_rows([row])


def test_missing_keys_are_named() -> None:
    row = make_row()
    del row["compression_seconds"]
    with pytest.raises(ValueError, match=r"lacks \['compression_seconds'\]"):
        build_report([row])


def test_no_rows_is_an_error() -> None:
    with pytest.raises(ValueError, match="rows"):
        build_report([{"type": "header", "commit": "abc"}])


def test_ordering_of_sections_tasks_methods_and_budgets() -> None:
    rows = []
    for mode in ("query_aware", "query_agnostic"):
        for task in ("zeta", "alpha"):
            rows += cell_rows(task, "tova", "B=128", [1, 0], mode=mode, length=512)
            rows += cell_rows(task, "tova", "B=16", [1, 0], mode=mode, length=512)
            rows += cell_rows(task, "snapkv", "ratio=0.5", [1, 0], mode=mode, length=512)
            rows += cell_rows(task, "snapkv", "B=128", [1, 1], mode=mode, length=512)
        rows += cell_rows("alpha", "tova", "B=128", [1, 0], mode=mode, length=128)
    text = build_report(rows)
    headings = re.findall(r"^## (.*)$", text, flags=re.M)
    assert headings == [
        "tiny · query_agnostic · 128 tokens", "tiny · query_agnostic · 512 tokens",
        "tiny · query_aware · 128 tokens", "tiny · query_aware · 512 tokens",
    ]  # fmt: skip
    last = section_of(text, "## tiny · query_aware · 512 tokens")
    assert re.findall(r"^\*\*(\w+)\*\*", last, flags=re.M) == ["alpha", "zeta"]
    assert "| method | B=16 | B=128 | ratio=0.5 |" in last
    macro = section_of(last, "### Averaged").splitlines()
    methods = [line.split("|")[1].strip() for line in macro if line.startswith("| `")]
    assert methods == ["`tova`", "`snapkv`"]


def test_compression_time_medians_and_ratios() -> None:
    rows = cell_rows("t", "snapkv", "B=64", [1, 0, 1], seconds=2.0)
    rows += [make_row(task="t", index=i, method="lore_kv", seconds=s) for i, s in enumerate([3.0, 5.0, 100.0])]
    timing = section_of(build_report(rows), "### Compression time")
    assert "Median `compression_seconds`" in timing and "over the samples of this run" in timing
    assert table_row(timing, "snapkv") == ["2.00 s (1.00x ref)"]
    assert table_row(timing, "lore_kv") == ["5.00 s (2.50x ref)"]
    assert "counted in full in every cell" in timing and "prefill was not timed in this run" in timing


def test_compression_time_against_transformers_prefill() -> None:
    rows = cell_rows("t", "snapkv", "B=64", [1, 0, 1], seconds=2.0)
    for row, floor in zip(rows, [1.0, 2.0, 4.0], strict=True):
        row["seconds"]["reference_prefill"] = floor
    timing = section_of(build_report(rows), "### Compression time")
    assert table_row(timing, "snapkv") == ["2.00 s (1.00x ref, 1.00x prefill)"]  # median of 2, 1, 0.5
    assert "transformers' own SDPA prefill" in timing


def test_budgets_are_stated_as_a_fraction_of_the_prompt() -> None:
    rows = cell_rows("t", "snapkv", "B=64", [1, 0, 1])
    for row in rows:
        row["candidates"] = 640
    assert "B=64 keeps 10.0%" in build_report(rows)


def test_a_decoding_section_states_budgets_of_every_token_fed_and_the_cache_held() -> None:
    """``decoding`` mode: B against prompt and answer, the compressions made while generating, and
    each cell's bytes against the full cache's on the same sample (the median of the ratios)."""
    rows = cell_rows("t", "full", "full", [1, 1, 0], mode="decoding")
    rows += cell_rows("t", "tova", "B=64", [1, 0, 0], mode="decoding")
    for i, row in enumerate(rows):
        row["candidates"] = 640
        row["kv_bytes_before"] = row["kv_bytes_after"] = 1000 * (i % 3 + 1) if row["method"] == "full" else 0
    for row, held in zip(rows[3:], [100, 1000, 900], strict=True):
        row["kv_bytes_after"] = held  # 0.1, 0.5, 0.3 of the full cache's 1000, 2000, 3000
    report = build_report(rows)
    assert "a fraction of every token fed (prompt and answer)" in report and "B=64 keeps 10.0%" in report
    assert "while the answer was generated" in section_of(report, "### Compression time")
    assert table_row(section_of(report, "### Cache held"), "tova") == ["0.30"]
    assert "### Cache held" not in build_report(cell_rows("t", "tova", "B=64", [1, 0, 0]))


def test_header_summary_is_shown_and_tolerant() -> None:
    header = {
        "type": "header", "lorekv": "0.2.0", "commit": "abc1234", "packages": {"torch": "2.6", "transformers": "4.50"},
        "machine": {"cpu": "Xeon", "cores": 2}, "threads": 2, "device": "cpu", "dtype": "float32",
        "started": "2026-12-01T10:00:00Z",
    }  # fmt: skip
    rows = cell_rows("t", "snapkv", "B=64", [1, 0])
    text = build_report([header, *rows])
    top = text.split("## ")[0]
    for piece in ("lorekv 0.2.0 (commit `abc1234`)", "torch 2.6, transformers 4.50", "cpu Xeon, cores 2",
                  "device cpu, dtype float32, threads 2", "started 2026-12-01T10:00:00Z"):  # fmt: skip
        assert piece in top
    assert "Run metadata: none given" in build_report(rows)
    assert "commit `x`" in build_report(rows, [{"type": "header", "commit": "x"}])
    two = build_report(rows, [{"commit": "x"}, {"commit": "y"}, {"commit": "x"}])
    assert "**Run 1**" in two and "**Run 2**" in two and "**Run 3**" not in two


def test_split_records_separates_headers() -> None:
    rows, headers = split_records([{"type": "header", "commit": "x"}, make_row(), {"type": "progress"}])
    assert len(rows) == 1 and headers == [{"type": "header", "commit": "x"}]


def test_write_report_writes_markdown_and_linked_figures(tmp_path: Path) -> None:
    rows = grid(n=4, keep_maps=True) + grid(n=4, mode="query_agnostic")
    rows += cell_rows("niah", "lore_kv[M=2]", "B=64", [1, 0, 1, 1], group="futures M")
    rows += cell_rows("niah", "lore_kv[M=8]", "B=64", [1, 1, 1, 1], group="futures M")
    path = write_report(rows, [{"commit": "abc"}], tmp_path / "out", resamples=500)
    assert path == tmp_path / "out" / "report.md"
    text = path.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 2 + 1 + 1 + 2  # two sections; ablations in one, keep map in the other
    for link in links:
        assert not Path(link).is_absolute() and link.startswith("figures/")
        png = (path.parent / link).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert "Ablations" in section_of(text, "## tiny · query_aware · 256 tokens")


def test_write_report_without_figures(tmp_path: Path) -> None:
    path = write_report(cell_rows("t", "snapkv", "B=64", [1, 0]), [], tmp_path, figures=False, resamples=500)
    assert "No figures were written" in path.read_text()
    assert not (tmp_path / "figures").exists()


def test_keep_map_round_trip() -> None:
    mask = np.random.default_rng(0).random((3, 2, 13)) < 0.4  # 78 bits: not a whole number of bytes
    field = encode_keep_map(mask, [0, 4, 7])
    assert field["shape"] == [3, 2, 13] and field["layers"] == [0, 4, 7]
    layers, back = decode_keep_map(field)
    assert layers == [0, 4, 7] and back.dtype == bool and np.array_equal(back, mask)


@pytest.mark.parametrize(
    ("mask", "layers", "name"),
    [(np.zeros((2, 3), bool), [0, 1], "mask"), (np.zeros((2, 1, 3), np.int8), [0, 1], "mask"),
     (np.zeros((2, 1, 3), bool), [0], "layers")],
)  # fmt: skip
def test_encode_keep_map_names_bad_inputs(mask: np.ndarray, layers: list[int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        encode_keep_map(mask, layers)


def test_decode_keep_map_rejects_a_wrong_length() -> None:
    field = encode_keep_map(np.ones((1, 1, 16), bool), [0]) | {"shape": [1, 1, 40]}
    with pytest.raises(ValueError, match="bits"):
        decode_keep_map(field)
