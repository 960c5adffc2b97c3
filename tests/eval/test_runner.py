"""Method resolution for the needle benchmark: presets at --budget, files as written, --set overrides."""

from __future__ import annotations

import pytest

from lorekv import PipelineConfig, preset
from lorekv.eval import FULL, ResultsFile, resolve_methods, summarize_needle
from lorekv.eval.runner import needle_key


def write(tmp_path, name: str, config: PipelineConfig):
    path = tmp_path / f"{name}.yaml"
    path.write_text(config.to_yaml())
    return path


def test_files_keep_their_budget_and_presets_take_budget(tmp_path) -> None:
    path = write(tmp_path, "variant", preset("lore_kv", 40))
    methods = resolve_methods([FULL, "snapkv"], 64, [path])
    assert list(methods) == [FULL, "snapkv", "variant"]
    assert methods[FULL] is None
    assert methods["snapkv"].policy.budget == 64
    assert methods["variant"].policy.budget == 40


def test_overrides_apply_to_every_pipeline(tmp_path) -> None:
    path = write(tmp_path, "variant", preset("lore_kv", 40))
    methods = resolve_methods(["lore_kv"], 64, [path], {"policy.budget": 32, "sampler.num_futures": 2})
    assert [m.policy.budget for m in methods.values()] == [32, 32]
    assert [m.sampler.num_futures for m in methods.values()] == [2, 2]


@pytest.mark.parametrize(
    "names,files,overrides,match",
    [
        (["nope"], [], None, "unknown"),
        ([], [], None, "nothing to run"),
        (["lore_kv"], [], {"policy.budgett": 3}, "budgett"),
        (["lore_kv"], [], {"policy.budget": 0}, "budget"),
        (["lore_kv"], [], {"budget": 3}, "<part>.<field>"),
    ],
)
def test_bad_methods_fail_before_any_model_work(names, files, overrides, match) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_methods(names, 64, files, overrides)


def test_a_file_may_not_shadow_a_method(tmp_path) -> None:
    path = write(tmp_path, "lore_kv", preset("lore_kv", 40))
    with pytest.raises(ValueError, match="taken"):
        resolve_methods(["lore_kv"], 64, [path])


def test_summary_counts_rows_of_each_method_at_its_own_budget(tmp_path) -> None:
    methods = resolve_methods([FULL, "lore_kv"], 64)
    results = ResultsFile(tmp_path / "r.jsonl")
    for seed, (method, config, budget, correct) in enumerate(
        [
            (FULL, None, None, True),
            ("lore_kv", methods["lore_kv"], 64, False),
            ("lore_kv", preset("lore_kv", 8), 8, True),
        ]
    ):
        key = needle_key("m", method, config, 100, seed)
        row = {"id": key, "model": "m", "method": method, "budget": budget, "haystack": 100}
        results.add({**row, "correct": correct, "seconds": 1.0 + seed})
    summary = {s.method: s for s in summarize_needle(results, model_name="m", methods=methods, tokens=100)}
    assert (summary[FULL].correct, summary[FULL].trials) == (1, 1)
    assert (summary["lore_kv"].correct, summary["lore_kv"].trials, summary["lore_kv"].budget) == (0, 1, 64)
