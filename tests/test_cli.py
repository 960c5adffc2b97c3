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
        (["demo", "--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
        (["demo", "--depth", "2"], r"depth must lie in \[0, 1\]"),
        (["demo", "--tokens", "10"], "tokens .* >= 64"),
        (["demo", "--budget", "0"], "budget"),
        (["demo", "--budget", "16"], "budget must be > window"),
        (["needle", "--tokens", "10"], "tokens .* >= 64"),
        (["needle", "--methods", ","], "nothing to run"),
        (["needle", "--methods", "nope"], "unknown"),
        (["needle", "--trials", "0"], "trials"),
        (["needle", "--max-new-tokens", "0"], "max_new_tokens"),
        (["needle", "--set", "policy.budget=yes"], "policy.budget"),
        (["needle", "--set", "budget=3"], "<part>.<field>"),
        (["needle", "--set", "policy.budget"], "<part>.<field>=<value>"),
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
    code, output = run("needle", "--out", str(tmp_path))
    assert code == 2 and "is a directory" in output
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    code, output = run("generate", "--config", str(config), "--prompt-file", str(empty))
    assert code == 2 and "empty" in output


def test_presets_list_every_method() -> None:
    code, output = run("presets")
    assert code == 0 and len(output.strip().splitlines()) >= 10
