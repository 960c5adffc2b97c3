"""A grid's identity is what its methods resolve to, not their names: a preset whose default
changes, or an edited pipeline file, makes another grid, and a results file written before is
refused with the field that changed."""

from __future__ import annotations

import json

import pytest
import yaml
from tiny_models import tiny_llama, word_tokenizer

from lorekv.eval.grid import GridConfig
from lorekv.eval.harness import differences, run_grid
from lorekv.presets import PRESETS, preset

GRID = {
    "name": "identity",
    "models": ["tiny"],
    "methods": ["full", "lore_kv"],
    "budgets": [8],
    "ratios": [0.5],
    "tasks": ["niah_single"],
    "lengths": [300],
    "samples": 1,
}


def tiny_loader(name, grid):
    return tiny_llama(layers=2).float(), word_tokenizer()


def with_lore_kv_default(monkeypatch, **defaults) -> None:
    """``preset("lore_kv", ...)`` with other defaults, as a later lorekv version might have."""
    original = PRESETS["lore_kv"]
    monkeypatch.setitem(PRESETS, "lore_kv", lambda budget, **options: original(budget, **{**defaults, **options}))


def test_the_header_records_what_every_column_resolves_to(tmp_path) -> None:
    path = run_grid(GridConfig.model_validate(GRID), tmp_path / "r.jsonl", loader=tiny_loader, progress=False)
    header = json.loads(path.read_text().splitlines()[0])
    expected = preset("lore_kv", 8).model_dump(mode="json")
    assert expected.pop("agnostic_sampler")["name"] == "kvzip"
    assert expected.pop("agnostic_scorer")["name"] == "attention_mass"
    assert expected.pop("agnostic_policy")["name"] == "global"
    assert header["pipelines"]["lore_kv|B=8"] == expected, "a query-aware grid never runs the agnostic parts"
    assert header["pipelines"]["lore_kv|ratio=0.5"]["sampler"] == preset("lore_kv", 1).model_dump()["sampler"]
    assert set(header["pipelines"]) == {"lore_kv|B=8", "lore_kv|ratio=0.5"}, "the full cache has no pipeline"


def test_the_agnostic_futures_are_part_of_a_grid_only_where_it_compresses_query_agnostically() -> None:
    tuned = {
        **GRID,
        "methods": ["full", {"name": "lore_kv", "preset": "lore_kv", "set": {"agnostic_sampler.chunk_size": 9}}],
    }
    assert GridConfig.model_validate(tuned).pipelines() == GridConfig.model_validate(GRID).pipelines()
    agnostic = {**GRID, "modes": ["query_aware", "query_agnostic"]}
    column = GridConfig.model_validate(agnostic).pipelines()["lore_kv|B=8"]
    assert column == preset("lore_kv", 8).model_dump(mode="json") and "agnostic_scorer" in column
    tuned_column = GridConfig.model_validate({**tuned, "modes": agnostic["modes"]}).pipelines()["lore_kv|B=8"]
    assert tuned_column["agnostic_sampler"]["chunk_size"] == 9


def test_a_changed_preset_default_is_another_grid(monkeypatch) -> None:
    before = GridConfig.model_validate(GRID).digest
    with_lore_kv_default(monkeypatch, num_futures=3)
    assert GridConfig.model_validate(GRID).digest != before
    pinned = {**GRID, "methods": ["full", {"name": "lore_kv", "preset": "lore_kv", "options": {"num_futures": 4}}]}
    monkeypatch.undo()
    unpinned_before = GridConfig.model_validate(pinned).digest
    with_lore_kv_default(monkeypatch, num_futures=3)
    assert GridConfig.model_validate(pinned).digest == unpinned_before, "a pinned option keeps the grid"


def test_resuming_after_a_preset_default_changed_is_refused_naming_the_field(tmp_path, monkeypatch) -> None:
    out = tmp_path / "r.jsonl"
    run_grid(GridConfig.model_validate(GRID), out, loader=tiny_loader, progress=False)
    written = out.read_text()
    with_lore_kv_default(monkeypatch, num_futures=3)
    with pytest.raises(ValueError, match=r"lore_kv\|B=8 sampler\.num_futures: 4 -> 3.*pin the old values"):
        run_grid(GridConfig.model_validate(GRID), out, loader=tiny_loader, progress=False)
    assert out.read_text() == written


def test_a_results_file_without_recorded_pipelines_is_refused_saying_why(tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    run_grid(GridConfig.model_validate(GRID), out, loader=tiny_loader, progress=False)
    header, *rows = out.read_text().splitlines()
    legacy = {k: v for k, v in json.loads(header).items() if k != "pipelines"} | {"grid": "f8b9e6f31395630e"}
    out.write_text("\n".join([json.dumps(legacy), *rows]) + "\n")
    with pytest.raises(ValueError, match="before results files recorded the pipelines"):
        run_grid(GridConfig.model_validate(GRID), out, loader=tiny_loader, progress=False)


def test_a_pipeline_file_is_read_into_the_grid_so_editing_it_makes_another_grid(tmp_path) -> None:
    (tmp_path / "mine.yaml").write_text(preset("lore_kv", 99, num_futures=2).to_yaml())
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump({**GRID, "methods": [{"name": "mine", "config": "mine.yaml"}]}))
    grid = GridConfig.from_file(grid_file)
    assert grid.methods[0].config["sampler"]["num_futures"] == 2, "the header holds the pipeline, not a path"
    (tmp_path / "mine.yaml").write_text(preset("lore_kv", 99, num_futures=3).to_yaml())
    assert GridConfig.from_file(grid_file).digest != grid.digest
    (tmp_path / "mine.yaml").unlink()
    with pytest.raises(ValueError, match=r"grid\.yaml: method mine: .*no such pipeline config file"):
        GridConfig.from_file(grid_file)


def test_differences_name_every_changed_field_and_only_those() -> None:
    was = {"sampler": {"name": "temperature", "temperature": 1.0, "seed": 0}, "policy": {"budget": 8}}
    now = {"sampler": {"name": "temperature", "temperature": 0.7, "seed": 0, "draws": "x"}, "policy": {"budget": 8}}
    assert differences(was, now) == [("sampler.draws", None, "x"), ("sampler.temperature", 1.0, 0.7)]
    assert differences(was, was) == []
