"""The CLI refuses bad input with one line naming the parameter or file, before loading a model."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lorekv import preset
from lorekv.cli import app


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to load a model fails the test: every case here must be refused before."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("lorekv.models.load", forbidden)


def run(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "args,match",
    [
        (["demo", "--length", "10"], "length must be an integer >= 256"),
        (["demo", "--task", "nope"], "nope"),
        (["demo", "--budget", "0"], "budget"),
        (["demo", "--budget", "16"], "budget must be > window"),
        (["demo", "--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
        (
            ["generate", "--preset", "lore_kv", "--budget", "8", "--prompt-file", "p", "--set", "policy.budget=yes"],
            "policy.budget",
        ),
        (
            ["generate", "--preset", "lore_kv", "--budget", "8", "--prompt-file", "p", "--set", "budget=3"],
            "<part>.<field>",
        ),
        (
            ["generate", "--preset", "lore_kv", "--budget", "8", "--prompt-file", "p", "--set", "policy.budget"],
            "<part>.<field>=<value>",
        ),
    ],
)
def test_bad_arguments_fail_before_the_model_loads(no_model, args, match) -> None:
    code, output = run(*args)
    assert code == 2, output
    assert output.startswith("error: ") and output.count("\n") == 1, "one line"
    assert pytest.importorskip("re").search(match, output), output


def test_bad_files_fail_before_the_model_loads(no_model, tmp_path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    config = tmp_path / "c.yaml"
    config.write_text(preset("lore_kv", 8).to_yaml())
    cases = {
        "malformed.yaml": ("sampler: [unclosed", "malformed.yaml: not valid YAML"),
        "garbage.json": ('{"sampler": "greedy"} trailing', "garbage.json: not valid JSON"),
        "int_component.yaml": ("sampler: 3\nscorer: loo\npolicy: {name: uniform, budget: 4}", "int_component.yaml"),
        "bool_budget.yaml": (
            "sampler: greedy\nscorer: loo\npolicy: {name: uniform, budget: true}",
            "bool_budget.yaml.*budget",
        ),
    }
    for name, (text, match) in cases.items():
        (tmp_path / name).write_text(text)
        code, output = run("generate", "--config", str(tmp_path / name), "--prompt-file", str(prompt))
        assert code == 2 and pytest.importorskip("re").search(match, output), (name, output)
        assert output.count("\n") == 1, output
    code, output = run("generate", "--config", str(config), "--prompt-file", str(tmp_path))
    assert code == 2 and "--prompt-file" in output and "is a directory" in output
    code, output = run("generate", "--config", str(tmp_path), "--prompt-file", str(prompt))
    assert code == 2 and "is a directory" in output
    code, output = run("generate", "--config", str(config), "--budget", "3", "--prompt-file", str(prompt))
    assert code == 2 and "--set policy.budget=3" in output
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    code, output = run("generate", "--config", str(config), "--prompt-file", str(empty))
    assert code == 2 and "empty" in output


def test_presets_list_every_method() -> None:
    code, output = run("presets")
    assert code == 0 and len(output.strip().splitlines()) >= 10


def test_eval_and_report_refuse_bad_input_before_any_work(no_model, tmp_path) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text("methods: [lore_kv]\nbudgets: [16]\ntasks: [niah_single]\nlengths: [512]\nsamples: 0\n")
    cases = [
        (["eval", str(tmp_path / "nope.yaml")], "nope.yaml: no such grid file"),
        (["eval", str(grid)], r"g.yaml: samples.*greater than or equal to 1"),
        (["eval", str(grid), str(grid)], "expected one grid file"),
        (["eval", "merge", str(grid)], "merge needs --out"),
        (["eval", "merge", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "m.jsonl")], "a.jsonl: no such file"),
        (["report", str(tmp_path / "empty.jsonl")], "no rows"),
    ]
    (tmp_path / "empty.jsonl").write_text("")
    grid_ok = tmp_path / "ok.yaml"
    grid_ok.write_text(grid.read_text().replace("samples: 0", "samples: 1"))
    cases += [
        (["eval", str(grid_ok), "--shard", "2/2"], "shard must be i/N"),
        (["eval", str(grid_ok), "--threads", "0"], "threads"),
    ]
    for args, match in cases:
        code, output = run(*args)
        assert code == 2 and pytest.importorskip("re").search(match, output), (args, output)
        assert output.count("\n") == 1, output


def test_report_writes_tables_and_figures_from_a_results_file(tmp_path) -> None:
    from tiny_models import tiny_llama, word_tokenizer

    from lorekv.eval import GridConfig, run_grid

    grid = GridConfig.model_validate({
        "models": ["tiny"],
        "methods": ["full", "lore_kv", {"name": "snapkv", "preset": "snapkv", "options": {"window": 4}}],
        "budgets": [8, 16], "tasks": ["niah_single"], "lengths": [300], "samples": 2,
    })  # fmt: skip
    path = run_grid(
        grid, tmp_path / "r.jsonl", loader=lambda name, g: (tiny_llama().float(), word_tokenizer()), progress=False
    )
    code, output = run("report", str(path), "--out", str(tmp_path / "report"), "--reference", "snapkv")
    assert code == 0, output
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Paired differences to `snapkv`" in text and "| `lore_kv` |" in text
    figures = sorted(p.name for p in (tmp_path / "report" / "figures").iterdir())
    assert figures and all((tmp_path / "report" / "figures" / f).stat().st_size > 1000 for f in figures)
    assert any("keep" in f for f in figures) and any("budget" in f for f in figures)


def test_report_keeps_only_the_named_tasks(tmp_path) -> None:
    from tiny_models import tiny_llama, word_tokenizer

    from lorekv.eval import GridConfig, run_grid

    grid = GridConfig.model_validate({
        "models": ["tiny"], "methods": ["full"], "tasks": ["niah_single", "niah_multikey"], "lengths": [300],
        "samples": 1,
    })  # fmt: skip
    path = run_grid(
        grid, tmp_path / "r.jsonl", loader=lambda name, g: (tiny_llama().float(), word_tokenizer()), progress=False
    )
    code, output = run("report", str(path), "--out", str(tmp_path / "rep"), "--no-figures", "--task", "niah_multikey")
    assert code == 0, output
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "**niah_multikey**" in text and "**niah_single**" not in text
    code, output = run("report", str(path), "--task", "nope")
    assert code == 2 and "task: no rows for ['nope']" in output
