"""Sampler seeds in a grid: one run per seed, rows that say which, and a report that averages each
prompt over the seeds and shows their spread."""

from __future__ import annotations

import statistics

import pytest
from tiny_models import tiny_llama, word_tokenizer

from lorekv.eval.grid import GridConfig, MethodSpec, with_sampler_seed
from lorekv.eval.harness import grid_cells, read_results, run_grid
from lorekv.eval.report import build_report
from lorekv.eval.rows import over_seeds, seed_spread
from lorekv.presets import preset

GRID = {
    "name": "seeds",
    "models": ["tiny"],
    "methods": ["full", {"name": "lore_kv", "preset": "lore_kv", "seeds": [0, 3]}, "greedy_lookahead"],
    "budgets": [8, 16],
    "tasks": ["niah_single", "niah_multikey"],
    "lengths": [300],
    "samples": 2,
}


def tiny_loader(name, grid):
    return tiny_llama(layers=2).float(), word_tokenizer()


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "full", "seeds": [0]}, "full cache"),
        ({"preset": "lore_kv", "seeds": []}, "seeds must be"),
        ({"preset": "lore_kv", "seeds": [1, 1]}, "seeds must be"),
        ({"preset": "lore_kv", "seeds": [-1]}, "seeds must be"),
        ({"preset": "lore_kv", "seeds": [0], "oracle": True}, "teacher-forced"),
    ],
)
def test_bad_seeds_are_refused(spec, match) -> None:
    with pytest.raises(ValueError, match=match):
        MethodSpec.model_validate(spec)


def test_a_deterministic_sampler_takes_no_seeds_and_the_grid_check_says_so() -> None:
    grid = GridConfig.model_validate({**GRID, "methods": [{"preset": "greedy_lookahead", "seeds": [0, 1]}]})
    with pytest.raises(ValueError, match="greedy_lookahead at B=8: .*greedy takes no seed"):
        grid.check()


def test_the_seed_reaches_the_samplers_and_each_seeded_component_of_a_mixture() -> None:
    lore_kv = preset("lore_kv", 8)
    config = with_sampler_seed(lore_kv, 7, "m")
    assert config.sampler.seed == 7 and config.model_copy(update={"sampler": lore_kv.sampler}) == lore_kv
    questions = lore_kv.override({"agnostic_sampler": {"name": "questions"}})
    config = with_sampler_seed(questions, 7, "m")
    assert config.sampler.seed == config.agnostic_sampler.seed == 7, "both modes' futures"
    assert config.agnostic_parts == questions.agnostic_parts
    agnostic_only = preset("snapkv", 64).override({"agnostic_sampler": {"name": "questions"}})
    assert with_sampler_seed(agnostic_only, 2, "m").agnostic_sampler.seed == 2
    mixed = preset("lore_kv", 8).override({
        "sampler": {"name": "mixture", "samplers": ["greedy", {"name": "temperature"}, {"name": "temperature"}]}
    })  # fmt: skip
    parts = with_sampler_seed(mixed, 5, "m").sampler.samplers
    assert [getattr(p, "seed", None) for p in parts] == [None, 5, 6]


def test_cells_expand_per_seed_with_distinct_keys() -> None:
    cells = grid_cells(GridConfig.model_validate(GRID))
    seeded = [(c.budget.label, c.seed) for c in cells if c.method.name == "lore_kv"]
    assert seeded == [("B=8", 0), ("B=8", 3), ("B=16", 0), ("B=16", 3)]
    assert all(c.seed is None for c in cells if c.method.name != "lore_kv")


@pytest.fixture(scope="module")
def seeded_rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("seeds") / "r.jsonl"
    rows, _ = read_results([run_grid(GridConfig.model_validate(GRID), out, loader=tiny_loader, progress=False)])
    return rows


def test_every_seed_runs_once_on_every_prompt_and_its_rows_say_which(seeded_rows) -> None:
    lore = [r for r in seeded_rows if r["method"] == "lore_kv"]
    assert len(lore) == 2 * 2 * 2 * 2 == len({r["id"] for r in lore})  # tasks x samples x budgets x seeds
    assert {r["sampler_seed"] for r in lore} == {0, 3}
    assert {r["sampler_seed"] for r in seeded_rows if r["method"] != "lore_kv"} == {None}


def test_the_report_averages_each_prompt_over_seeds_and_shows_the_spread(seeded_rows) -> None:
    rows = [dict(r) for r in seeded_rows]
    for r in rows:  # scores that make the mean and the range checkable
        if r["method"] == "lore_kv":
            r["score"] = 1.0 if (r["sampler_seed"] == 3 or r["index"] == 0) else 0.0
    averaged = over_seeds(rows)
    lore = [r for r in averaged if r["method"] == "lore_kv"]
    assert len(lore) == 2 * 2 * 2 and {r["sampler_seeds"] for r in lore} == {2}
    assert sorted({r["score"] for r in lore}) == [0.5, 1.0]
    assert len([r for r in averaged if r["method"] != "lore_kv"]) == len([r for r in rows if r["method"] != "lore_kv"])
    spread = seed_spread(rows)
    assert spread[("lore_kv", "B=8")] == {0: 0.5, 3: 1.0}
    text = build_report(rows, reference="lore_kv", resamples=200)
    assert "### Spread over sampler seeds" in text
    assert "0.75 (0.50–1.00; range 0.50; 2 seeds)" in text
    macro = statistics.fmean(spread[("lore_kv", "B=16")].values())
    assert f"| `lore_kv` | {macro:.2f}" in text.split("### Averaged over tasks")[1]
