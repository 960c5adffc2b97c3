"""The table shows every section; the JSON file round-trips and is written atomically."""

from __future__ import annotations

import json

import pytest

from lorekv.cost.report import SECTIONS, default_out, read_results, render, table, write_results


def test_the_table_shows_every_section_and_every_length(tiny_results) -> None:
    text = render(tiny_results)
    titles = [line[3:] for line in text.splitlines() if line.startswith("== ")]
    assert len(titles) == len(SECTIONS)
    assert all(title.startswith(section) for title, section in zip(titles, SECTIONS, strict=True)), titles
    machine = f"{tiny_results['machine']['cpu']}, {tiny_results['machine']['cores']} cores"
    for needle in ("n=32", "n=64", "sampling M=2", "scoring M=1", "projected_loo (eager)", "LORE-KV / SnapKV",
                   "full KV (before eviction)", "sampling vs M at n=64", "tok/s", "compile off",
                   machine, "torch " + tiny_results["packages"]["torch"], "load average",
                   "n=64 b=8", "gen tok/s", "prompt tok/s", "prompts/s", "/ b=1"):  # fmt: skip
        assert needle in text, needle
    assert "Targets" not in text, "targets are documentation, not code"


def test_the_batch_rows_show_the_throughputs_and_a_results_file_without_them_still_renders(tiny_results) -> None:
    lines = render(tiny_results).split("== Batch throughput")[1].splitlines()
    b1 = next(line for line in lines if line.startswith("n=64 b=1 "))
    assert b1.split()[2] == "64" and b1.count("1.00x") == 3
    older = {key: value for key, value in tiny_results.items() if key != "batch"}
    text = render(older)
    assert "== Decoding" in text and "Batch throughput" not in text


def test_the_json_round_trips(tiny_results, tmp_path) -> None:
    path = write_results(tiny_results, tmp_path / "deep" / "bench.json")
    assert read_results(path) == json.loads(json.dumps(tiny_results))
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "no temporary file left"
    with pytest.raises(ValueError, match="out: .* is a directory"):
        write_results(tiny_results, tmp_path)
    other = tmp_path / "other.json"
    other.write_text('{"type": "row"}')
    with pytest.raises(ValueError, match="not a lorekv bench results file"):
        read_results(other)


def test_default_out_names_model_and_device() -> None:
    assert str(default_out("smollm2-135m-instruct", "cpu")) == "results/bench/smollm2-135m-instruct-cpu.json"
    assert str(default_out("/models/Qwen2.5-7B/", "cuda:1")) == "results/bench/Qwen2.5-7B-cuda.json"
    assert str(default_out("owner/name x", "cuda")) == "results/bench/name_x-cuda.json"


def test_table_aligns_columns() -> None:
    text = table("T", ["", "a"], [["row", "1.0 ms"], ["longer row", "10.0 ms"]])
    lines = text.splitlines()
    assert lines[0] == "== T ==" and len({len(line) for line in lines[1:]}) <= 2
    assert lines[3].endswith(" 1.0 ms") and lines[4].endswith("10.0 ms")
