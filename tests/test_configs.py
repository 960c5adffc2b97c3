"""Every shipped configuration parses and round-trips: the presets and ``evaluations/configs``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lorekv import Pipeline, PipelineConfig, preset
from lorekv.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "evaluations" / "configs").glob("*.yaml"))


def round_trips(config: PipelineConfig, tmp_path: Path) -> None:
    assert PipelineConfig.model_validate(yaml.safe_load(config.to_yaml())) == config
    assert PipelineConfig.model_validate(json.loads(config.model_dump_json())) == config
    (tmp_path / "p.yaml").write_text(config.to_yaml())
    (tmp_path / "p.json").write_text(config.model_dump_json())
    assert PipelineConfig.from_file(tmp_path / "p.yaml") == config == PipelineConfig.from_file(tmp_path / "p.json")
    assert Pipeline.from_config(config).config == config


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("budget", [1, 64])
def test_every_preset_round_trips(name: str, budget: int, tmp_path: Path) -> None:
    try:
        config = preset(name, budget)
    except ValueError as error:
        assert "budget" in str(error)
        return
    assert config.policy.budget == budget
    round_trips(config, tmp_path)


def test_benchmark_configs_exist() -> None:
    assert len(SHIPPED) >= 4


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_parses_and_round_trips(path: Path, tmp_path: Path) -> None:
    config = PipelineConfig.from_file(path)
    assert config.model_dump(mode="json") == yaml.safe_load(path.read_text()), "the file spells out every field"
    round_trips(config, tmp_path)


@pytest.mark.parametrize("name", ["lore_kv", "snapkv", "greedy_lookahead"])
def test_last_prompt_query_option_round_trips(name: str, tmp_path: Path) -> None:
    config = preset(name, 40).override({"sampler.include_last_prompt_query": True})
    assert config.sampler.include_last_prompt_query is True
    assert "include_last_prompt_query: true" in config.to_yaml()
    round_trips(config, tmp_path)
    assert Pipeline.from_config(config).sampler.config.include_last_prompt_query is True
    assert preset(name, 40).sampler.include_last_prompt_query is False


GRIDS = sorted((ROOT / "evaluations" / "grids").glob("*.yaml"))


def test_benchmark_grids_exist() -> None:
    assert len(GRIDS) >= 4, GRIDS


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.name)
def test_every_shipped_grid_parses_and_builds_every_cell(path: Path) -> None:
    from lorekv.eval import GridConfig

    grid = GridConfig.from_file(path)  # builds every method at every budget
    assert grid.name == path.stem
    assert GridConfig.model_validate(grid.model_dump(mode="json")) == grid


DISTILLS = sorted((ROOT / "lorekv" / "surrogates").glob("*.yaml"))


@pytest.mark.parametrize("path", DISTILLS, ids=lambda p: p.name)
def test_every_shipped_distill_config_parses_and_names_its_file(path: Path) -> None:
    from lorekv.distill.run import DistillConfig
    from lorekv.scorers.surrogate import shipped_surrogates

    config = DistillConfig.from_file(path)
    config.teacher_config()  # the teacher builds
    assert path.stem.split(".")[-1] == config.teacher, "<model>.<teacher>.yaml"
    assert path.stem in shipped_surrogates(), "each config's fit ships beside it (make surrogates)"
