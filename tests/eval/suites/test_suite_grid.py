"""A grid mixing benchmark files and a generated task on a tiny model: every cell once, resumed
without redoing a cell, merged by shards, the suites' averages in the report."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml
from tiny_models import tiny_llama, word_tokenizer

from lorekv.eval.grid import GridConfig, units
from lorekv.eval.harness import merge, read_results, run_grid
from lorekv.eval.report import build_report

FIXTURES = Path(__file__).parent / "fixtures"
GRID = {
    "name": "files",
    "models": ["tiny"],
    "methods": ["full", "lore_kv", {"name": "snapkv", "preset": "snapkv", "options": {"window": 4}}],
    "budgets": [8],
    "ratios": [0.5],
    "tasks": [
        "niah_single",
        {"format": "longbench", "path": str(FIXTURES / "longbench"), "subtasks": ["hotpotqa", "passage_count"]},
        {"format": "ruler", "path": str(FIXTURES / "ruler")},
        {"format": "jsonl", "path": str(FIXTURES / "jsonl"), "title": "notes"},
    ],
    "lengths": [400],
    "modes": ["query_aware", "query_agnostic"],
    "samples": 1,
}
QUESTIONS = 1 + 3 + 2 + 3  # niah, LongBench (2 hotpotqa + 1 passage_count), RULER, notes
CELLS = 1 + 2 * 2


def tiny_loader(name, grid):
    return tiny_llama(layers=2, context=1024).float(), word_tokenizer()  # a reconstruction doubles the positions


def test_file_tasks_run_every_cell_once_and_report_the_suite_averages(tmp_path) -> None:
    grid = GridConfig.model_validate(GRID)
    path = run_grid(grid, tmp_path / "r.jsonl", loader=tiny_loader, progress=False)
    rows, (header,) = read_results([path])
    assert len(rows) == 2 * QUESTIONS * CELLS == len({r["id"] for r in rows})
    tasks = {r["task"] for r in rows}
    assert tasks == {
        "niah_single", "longbench/hotpotqa", "longbench/passage_count", "ruler/niah_single_1", "ruler/qa_1",
        "notes/notes",
    }  # fmt: skip
    assert {r["suite"] for r in rows} == {None, "LongBench", "RULER", "JSONL"}
    assert {r["metric"] for r in rows if r["task"] == "longbench/hotpotqa"} == {"qa_f1"}
    assert set(header["files"]) == {"longbench", "ruler", "notes"}

    report = build_report([header, *rows])
    assert "### LongBench scores" in report and "### RULER scores" in report
    section = [r for r in rows if r["mode"] == "query_aware" and r["suite"] == "LongBench" and r["method"] == "full"]
    per_task = {
        t: statistics.fmean(r["score"] for r in section if r["task"] == t) for t in {r["task"] for r in section}
    }
    average = 100 * statistics.fmean(per_task.values())
    line = next(ln for ln in report.split("### LongBench scores")[1].splitlines() if ln.startswith("| `full` | full |"))
    assert line.rstrip(" |").endswith(f"{average:.2f}"), "Avg is the mean over datasets, x 100"


def test_an_interrupted_file_grid_resumes_without_redoing_a_cell(tmp_path, monkeypatch) -> None:
    grid = GridConfig.model_validate(GRID)

    class Crash(Exception):
        pass

    written: list[dict] = []

    def crash(row: dict) -> None:
        written.append(row)
        if len(written) == 23:
            raise Crash

    out = tmp_path / "r.jsonl"
    with pytest.raises(Crash):
        run_grid(grid, out, loader=tiny_loader, progress=False, on_row=crash)
    first = out.read_text().splitlines()
    run_grid(grid, out, loader=tiny_loader, progress=False, on_row=written.append)
    assert out.read_text().splitlines()[: len(first)] == first
    rows, _ = read_results([out])
    assert len(rows) == len(written) == 2 * QUESTIONS * CELLS


def test_shards_of_a_file_grid_merge_into_the_whole(tmp_path) -> None:
    grid = GridConfig.model_validate({**GRID, "modes": ["query_agnostic"], "methods": ["full", "lore_kv"]})
    shards = [run_grid(grid, tmp_path / "r.jsonl", shard=(i, 2), loader=tiny_loader, progress=False) for i in range(2)]
    count, missing = merge(tmp_path / "all.jsonl", shards)
    assert count == QUESTIONS * 3 and not missing
    assert len(list(units(grid))) == QUESTIONS


def test_the_same_files_elsewhere_are_the_same_grid(tmp_path) -> None:
    for where in ("a", "b"):
        (tmp_path / where / "data").mkdir(parents=True)
        (tmp_path / where / "data" / "notes.jsonl").write_text((FIXTURES / "jsonl" / "harbour.jsonl").read_text())
        grid = {**GRID, "tasks": [{"format": "jsonl", "path": "data/notes.jsonl"}]}
        (tmp_path / where / "grid.yaml").write_text(yaml.safe_dump(grid))
    a, b = (GridConfig.from_file(tmp_path / where / "grid.yaml") for where in ("a", "b"))
    assert a.tasks[0].path != b.tasks[0].path, "each reads its own copy"
    assert a.digest == b.digest, "a checkout moved elsewhere could not resume its results"


def test_a_changed_file_is_another_grid(tmp_path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text((FIXTURES / "jsonl" / "harbour.jsonl").read_text())
    grid = GridConfig.model_validate({**GRID, "tasks": [{"format": "jsonl", "path": str(data)}]})
    before = grid.digest
    data.write_text(data.read_text().replace("red", "blue"))
    assert GridConfig.model_validate(grid.model_dump()).digest != before, "the results file would mix two datasets"


def test_relative_paths_resolve_against_the_grid_file_and_bad_files_fail_first(tmp_path) -> None:
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "notes.jsonl").write_text((FIXTURES / "jsonl" / "harbour.jsonl").read_text())
    spec = {**GRID, "tasks": [{"format": "jsonl", "path": "bench/notes.jsonl"}]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(spec))
    grid = GridConfig.from_file(tmp_path / "g.yaml")
    assert Path(grid.tasks[0].path) == folder / "notes.jsonl"
    (folder / "notes.jsonl").write_text('{"context": "c", "question": "q"}\n')
    with pytest.raises(ValueError, match=r"g\.yaml: .*notes\.jsonl:1: missing field 'answer'"):
        GridConfig.from_file(tmp_path / "g.yaml")
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({**spec, "tasks": [{"format": "jsonl", "path": "nope.jsonl"}]}))
    with pytest.raises(ValueError, match="nope.jsonl: no such file or folder"):
        GridConfig.from_file(tmp_path / "g.yaml")
