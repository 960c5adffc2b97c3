"""Grids: parsing, resuming without redoing a cell, shards in two processes, merging, the header."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_models import tiny_llama, word_tokenizer

from lorekv.eval.grid import GridConfig, units
from lorekv.eval.harness import merge, parse_shard, read_results, run_grid, shard_path

GRID = {
    "name": "tiny",
    "models": ["tiny"],
    "methods": ["full", "lore_kv", {"name": "snapkv", "preset": "snapkv", "options": {"window": 4}}],
    "budgets": [8, 16],
    "ratios": [0.5],
    "tasks": ["niah_single", {"name": "niah_multikey"}],
    "lengths": [300],
    "modes": ["query_aware", "query_agnostic"],
    "samples": 2,
    "seed": 1,
}
CELLS_PER_UNIT = 1 + 2 * 3
UNITS = 2 * 2 * 2  # tasks x modes x samples


def tiny_loader(name, grid):
    return tiny_llama(layers=2, context=1024).float(), word_tokenizer()  # a reconstruction doubles the positions


def test_a_grid_runs_every_cell_once_with_a_header(tmp_path) -> None:
    grid = GridConfig.model_validate(GRID)
    path = run_grid(grid, tmp_path / "r.jsonl", loader=tiny_loader, progress=False)
    rows, headers = read_results([path])
    assert len(rows) == UNITS * CELLS_PER_UNIT == len({r["id"] for r in rows})
    (header,) = headers
    assert header["grid"] == grid.digest and GridConfig.model_validate(header["grid_config"]) == grid
    assert {"commit", "packages", "machine", "threads", "seed", "started"} <= header.keys()
    assert header["packages"]["torch"] and header["machine"]["cores"] >= 1
    assert {r["budget_label"] for r in rows} == {"full", "B=8", "B=16", "ratio=0.5"}
    for r in rows:
        if r["ratio"] is not None:
            assert r["budget"] == round(0.5 * r["candidates"]) and r["kept"] == r["budget"]
    assert all(0.0 <= r["score"] <= 1.0 for r in rows)
    maps = [r for r in rows if r["keep_map"] is not None]
    assert maps and {r["index"] for r in maps} == {0} and all(r["gold_positions"] for r in maps)


def test_an_interrupted_grid_resumes_without_redoing_or_losing_a_cell(tmp_path, monkeypatch) -> None:

    grid = GridConfig.model_validate(GRID)
    decoded = count_decoded(monkeypatch)

    class Crash(Exception):
        pass

    def crash_after(k):
        def on_row(row):
            if len(decoded) >= k:
                raise Crash

        return on_row

    out = tmp_path / "r.jsonl"
    with pytest.raises(Crash):
        run_grid(grid, out, loader=tiny_loader, progress=False, on_row=crash_after(10))  # mid-unit
    first = out.read_text().splitlines()
    assert len(first) == 1 + CELLS_PER_UNIT + 1 + 4  # header, the first unit, the second's full cache and 4 cells
    decoded.clear()
    run_grid(grid, out, loader=tiny_loader, progress=False)
    lines = out.read_text().splitlines()
    assert lines[: len(first)] == first, "finished rows are kept as written"
    rows, _ = read_results([out])
    assert len(rows) == UNITS * CELLS_PER_UNIT == len({r["id"] for r in rows})
    assert len(decoded) == UNITS * (CELLS_PER_UNIT - 1) - 10, "no finished cell is decoded again"


def test_another_grid_is_refused_in_an_existing_results_file(tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    run_grid(GridConfig.model_validate({**GRID, "samples": 1}), out, loader=tiny_loader, progress=False)
    with pytest.raises(ValueError, match="another run"):
        run_grid(GridConfig.model_validate({**GRID, "samples": 2}), out, loader=tiny_loader, progress=False)


def test_shard_parsing_and_environment() -> None:
    assert parse_shard("1/3", {}) == (1, 3)
    assert parse_shard(None, {"RANK": "2", "WORLD_SIZE": "4"}) == (2, 4)
    assert parse_shard(None, {}) == (0, 1)
    for bad in ("3/3", "1", "a/2", "-1/2"):
        with pytest.raises(ValueError, match="shard must be i/N"):
            parse_shard(bad, {})
    assert shard_path(Path("r.jsonl"), (1, 2)) == Path("r.shard1of2.jsonl")


@pytest.mark.parametrize(
    "change,match",
    [
        ({"methods": ["nope"]}, "preset"),
        ({"budgets": [0]}, "budgets"),
        ({"ratios": [1.0]}, "ratios"),
        ({"tasks": ["nope"]}, "nope"),
        ({"methods": [{"name": "snapkv", "preset": "snapkv"}]}, "budget must be > window"),
        ({"methods": ["lore_kv", "lore_kv"]}, "distinct"),
        ({"methods": [{"name": "x", "preset": "lore_kv", "budgets": [64]}]}, "among the grid's budgets"),
        ({"surprise": 1}, "surprise"),
        ({"lengths": [128]}, "lengths: length must be an integer >= 256"),
        ({"models": ["smollm2-135m-instruct"], "device_map": "auto"}, "device_map applies to"),
        ({"methods": [{"name": "x", "preset": "lore_kv", "set": {"policy.budget": 64}}]}, "set changes the policy"),
    ],
)
def test_bad_grids_are_refused_before_any_work(tmp_path, change, match) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({**GRID, **change}))
    with pytest.raises(ValueError, match=match):
        GridConfig.from_file(path)


def save_tiny_model(folder: Path) -> Path:
    tiny_llama(layers=2).float().save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def test_two_shard_processes_merge_into_the_whole_grid(tmp_path) -> None:
    """``lorekv eval --shard i/2`` in two concurrent processes, then ``lorekv eval merge``."""
    model = save_tiny_model(tmp_path / "tiny")
    grid = {**GRID, "models": [str(model)], "modes": ["query_aware"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "lorekv", "eval", str(tmp_path / "g.yaml"), "--out", str(out), "--no-progress"]
    procs = [
        subprocess.Popen([*command, "--shard", f"{i}/2", "--threads", "1"], env=env, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    shards = [tmp_path / "r.shard0of2.jsonl", tmp_path / "r.shard1of2.jsonl"]
    parts = [read_results([s])[0] for s in shards]
    assert all(parts) and not {r["id"] for r in parts[0]} & {r["id"] for r in parts[1]}
    merged = tmp_path / "merged.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "lorekv", "eval", "merge", *map(str, shards), "--out", str(merged)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows, headers = read_results([merged])
    assert len(rows) == 2 * 2 * CELLS_PER_UNIT == len({r["id"] for r in rows})
    assert [s["shard"] for s in headers[0]["merged_from"]] == [[0, 2], [1, 2]]

    whole = run_grid(GridConfig.from_file(tmp_path / "g.yaml"), tmp_path / "whole.jsonl", progress=False)
    single = {r["id"]: r["prediction"] for r in read_results([whole])[0]}
    assert {r["id"]: r["prediction"] for r in rows} == single, "sharding changes no answer"


def test_merge_refuses_shards_of_different_grids_and_missing_cells(tmp_path) -> None:
    a = run_grid(
        GridConfig.model_validate({**GRID, "samples": 1}),
        tmp_path / "a.jsonl",
        shard=(0, 2),
        loader=tiny_loader,
        progress=False,
    )
    b = run_grid(
        GridConfig.model_validate({**GRID, "samples": 1, "seed": 2}),
        tmp_path / "b.jsonl",
        shard=(1, 2),
        loader=tiny_loader,
        progress=False,
    )
    with pytest.raises(ValueError, match="different grids"):
        merge(tmp_path / "m.jsonl", [a, b])
    with pytest.raises(ValueError, match="cells are missing"):
        merge(tmp_path / "m.jsonl", [a])
    count, missing = merge(tmp_path / "m.jsonl", [a], allow_missing=True)
    assert count and len(missing) == count  # half the units in each shard
    with pytest.raises(ValueError, match="also in another shard"):
        merge(tmp_path / "m2.jsonl", [a, a])
    assert json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])["type"] == "header"


def test_a_pipeline_file_runs_at_every_budget_of_the_grid(tmp_path) -> None:
    from lorekv import preset

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "mine.yaml").write_text(preset("lore_kv", 99, num_futures=2).to_yaml())
    grid = GridConfig.model_validate(
        {**GRID, "methods": [{"name": "mine", "config": "pipelines/mine.yaml"}], "ratios": [], "samples": 1}
    )
    path = run_grid(grid, tmp_path / "r.jsonl", base=tmp_path, loader=tiny_loader, progress=False)
    rows, _ = read_results([path])
    assert {(r["method"], r["budget"]) for r in rows} == {("mine", 8), ("mine", 16)}
    assert all(r["kept"] == r["budget"] for r in rows)
    with pytest.raises(ValueError, match="no such pipeline config file"):
        grid.check(base=tmp_path / "elsewhere")


def test_a_second_writer_of_one_results_file_is_refused(tmp_path) -> None:
    from lorekv.eval.harness import exclusive

    out = tmp_path / "r.jsonl"
    with exclusive(out), pytest.raises(ValueError, match="being written by another process"):
        run_grid(GridConfig.model_validate({**GRID, "samples": 1}), out, loader=tiny_loader, progress=False)
    run_grid(GridConfig.model_validate({**GRID, "samples": 1}), out, loader=tiny_loader, progress=False)


def test_readers_never_change_a_file_being_written(tmp_path) -> None:
    out = run_grid(
        GridConfig.model_validate({**GRID, "samples": 1}), tmp_path / "r.jsonl", loader=tiny_loader, progress=False
    )
    text = out.read_text()
    out.write_text(text + '{"type": "row", "id": "half')  # a writer mid-append
    rows, headers = read_results([out])
    assert len(rows) == len(text.splitlines()) - 1 and headers
    assert out.read_text() == text + '{"type": "row", "id": "half'
    with pytest.raises(ValueError, match="exists"):
        merge(out, [tmp_path / "other.jsonl"])


def test_shards_hold_every_task_even_when_the_shard_count_divides_the_task_count() -> None:
    from lorekv.eval.harness import shard_units

    grid = GridConfig.model_validate({**GRID, "samples": 4, "modes": ["query_aware"]})
    for i in range(2):
        mine = shard_units(grid, (i, 2))
        assert {u.task.label for u in mine} == {t.label for t in grid.tasks} and len(mine) == 4
    assert sorted(u.key for i in range(2) for u in shard_units(grid, (i, 2))) == sorted(u.key for u in units(grid))


def test_a_compression_ratio_is_the_fraction_evicted() -> None:
    from lorekv.eval.grid import Budget

    assert Budget(ratio=0.75).resolve(100) == 25 and Budget(ratio=0.9).resolve(1000) == 100
    assert Budget(ratio=0.75).label == "ratio=0.75" and Budget(tokens=16).resolve(100) == 16
    with pytest.raises(ValueError, match="keeps no token"):
        Budget(ratio=0.99).resolve(20)


BATCHED = {
    **GRID,
    "methods": [
        "full",
        {"name": "lore_kv", "preset": "lore_kv", "options": {"num_futures": 2}},  # every row's futures at once
        {"name": "oracle", "preset": "lore_kv", "oracle": True},  # a sampler of each row's own
    ],
    "budgets": [],
    "ratios": [0.5],  # a budget of each row's own
}
BATCHED_CELLS = 3
BATCHED_ROWS = 2 * 2 * 2 * BATCHED_CELLS  # modes x tasks x samples x cells
TIMES = ("seconds", "compression_seconds")


def untimed(path: Path) -> dict[str, dict]:
    return {r["id"]: {k: v for k, v in r.items() if k not in TIMES} for r in read_results([path])[0]}


@pytest.fixture(scope="module")
def batch_one(tmp_path_factory) -> dict[str, dict]:
    """The batched grid's rows at batch size 1, without their times."""
    out = tmp_path_factory.mktemp("one") / "r.jsonl"
    return untimed(run_grid(GridConfig.model_validate(BATCHED), out, loader=tiny_loader, progress=False))


def count_batches(monkeypatch) -> list[int]:
    import lorekv.eval.harness as harness

    sizes: list[int] = []
    real = harness.run_units

    def run_units(model, tokenizer, units, *args, **kwargs):
        sizes.append(len(units))
        return real(model, tokenizer, units, *args, **kwargs)

    monkeypatch.setattr(harness, "run_units", run_units)
    return sizes


def count_decoded(monkeypatch) -> list[int]:
    import lorekv.eval.shared as shared

    decoded: list[int] = []
    real = shared.decode_batch

    def decode_batch(*args, **kwargs):
        generations = real(*args, **kwargs)
        decoded.extend([1] * len(generations))
        return generations

    monkeypatch.setattr(shared, "decode_batch", decode_batch)
    return decoded


def test_a_batched_grid_writes_the_rows_of_batch_size_one(tmp_path, monkeypatch, batch_one) -> None:
    """Both modes, prompts of different lengths in one batch, per-row samplers and budgets:
    every row but its times is the one batch size 1 writes."""
    sizes = count_batches(monkeypatch)
    grid = GridConfig.model_validate({**BATCHED, "batch_size": 4})
    four = run_grid(grid, tmp_path / "four.jsonl", loader=tiny_loader, progress=False)
    assert sizes == [4, 4], "the units of each mode in one batch"
    rows = untimed(four)
    assert len(rows) == BATCHED_ROWS and rows == batch_one
    assert len({r["tokens"] for r in rows.values()}) > 1, "the batches were padded"
    assert read_results([four])[1][0]["grid"] == GridConfig.model_validate(BATCHED).digest, "not in the digest"


def test_a_batched_run_resumes_without_redoing_a_finished_cell(tmp_path, monkeypatch, batch_one) -> None:
    decoded = count_decoded(monkeypatch)

    class Crash(Exception):
        pass

    def on_row(row):
        if len(decoded) > 4:  # the first row of the batch's second compressed cell
            raise Crash

    grid = GridConfig.model_validate({**BATCHED, "batch_size": 4})
    out = tmp_path / "r.jsonl"
    with pytest.raises(Crash):
        run_grid(grid, out, loader=tiny_loader, progress=False, on_row=on_row)
    written = untimed(out)
    assert sum(r["method"] != "full" for r in written.values()) == 4 + 1 and len(written) == 4 + 4 + 1
    decoded.clear()
    sizes = count_batches(monkeypatch)
    run_grid(grid, out, loader=tiny_loader, progress=False)
    rows = untimed(out)
    assert len(rows) == BATCHED_ROWS and {k: rows[k] for k in written} == written
    assert len(decoded) == 2 * 2 * 2 * (BATCHED_CELLS - 1) - 5, "no finished cell is decoded again"
    assert sizes == [3, 4], "the three units with their last cell left (the first has none), the other mode"
    assert rows == batch_one


def test_batch_size_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 1.5, "4", True):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            GridConfig.model_validate({**GRID, "batch_size": bad})
