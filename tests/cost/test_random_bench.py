"""``lorekv bench`` on a published architecture with random weights: options checked before any model is
built, prompts of random token ids, and results that say the weights are random."""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from lorekv.cli import app
from lorekv.cost import BenchConfig, known_context, render, run_bench, write_results
from lorekv.cost.prompts import RandomPrompts, batch_of

QUICK = {
    "model": "random:mistral-7b",
    "layers": 1,
    "width": 8,
    "lengths": (32, 64),
    "futures": (1,),
    "num_futures": 2,
    "budget": 40,
    "repeats": 1,
    "decode_tokens": 3,
    "threads": 1,
    "compile": False,
    "scorers": ("attention_mass",),
    "batch_sizes": (1, 2),
}


def test_a_random_architecture_runs_end_to_end_and_says_its_weights_are_random(tmp_path) -> None:
    results = run_bench(BenchConfig(**QUICK))
    weights = results["weights"]
    assert weights["weights"] == "random" and weights["architecture"] == "mistral-7b"
    assert weights["source"] == "mistralai/Mistral-7B-Instruct-v0.3"
    assert (weights["layers"], weights["published_layers"], weights["width"]) == (1, 32, 8)
    assert "accuracy" in weights["cannot_measure"] and weights["parameters"] > 0
    assert results["prompts"] == "random token ids (no tokenizer)"
    assert results["settings"]["layers"] == 1 and results["settings"]["width"] == 8
    assert list(results["lengths"]) == ["32", "64"] and set(results["batch"]["64"]) == {"1", "2"}
    saved = json.loads(write_results(results, tmp_path / "r.json").read_text())
    assert saved["weights"]["weights"] == "random"
    text = render(results)
    assert "RANDOM: mistral-7b as published by mistralai/Mistral-7B-Instruct-v0.3; 1 of 32 layers" in text
    assert "cannot measure  accuracy" in text


def test_random_prompts_are_seeded_token_ids_within_the_vocabulary() -> None:
    prompts = RandomPrompts(50)
    ids = prompts(300, 4)
    assert ids.shape == (1, 300) and 0 <= ids.min() and ids.max() < 50
    assert torch.equal(ids, prompts(300, 4)) and not torch.equal(ids, prompts(300, 5))
    batch, mask = batch_of(prompts, 64, 3, seed=2)
    assert torch.equal(batch[:1], prompts(64, 2)) and torch.equal(batch[2:, 8:], prompts(56, 4))
    assert mask.sum(1).tolist() == [64, 60, 56] and (batch[2, :8] == prompts.pad_id).all()


def test_label_and_context_of_a_random_architecture() -> None:
    assert BenchConfig(model="random:llama-3.1-8b", layers=2, width=4, lengths=(64,)).label == (
        "random:llama-3.1-8b-L2-w4"
    )
    assert BenchConfig(model="random:llama-3.1-8b", lengths=(64,)).label == "random:llama-3.1-8b"
    assert known_context("random:llama-3.1-8b") == 131072 and known_context("random:gemma-3-4b") == 131072
    assert known_context("random:nope") is None


def test_the_cli_passes_the_shrink_settings_and_names_the_file_after_them(monkeypatch, tmp_path, tiny_results):
    seen = {}

    def fake_run_bench(config, **kwargs):
        seen["config"] = config
        return tiny_results

    monkeypatch.setattr("lorekv.cost.run_bench", fake_run_bench)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["bench", "--model", "random:gemma-3-4b", "--layers", "6", "--width", "2", "--lengths", "512"]
    )
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.model, config.layers, config.width) == ("random:gemma-3-4b", 6, 2)
    assert (tmp_path / "results" / "bench" / "random_gemma-3-4b-L6-w2-cpu.json").is_file()


@pytest.mark.parametrize(
    "args,match",
    [
        (["--model", "random:llama-4"], r"model: unknown architecture 'random:llama-4'; the random-weight models "
         r"are random:gemma-3-12b, random:gemma-3-4b, random:llama-3.1-8b"),
        (["--model", "random:llama-3.1-8b", "--layers", "0"], r"layers: layers must be an integer from 1 to 32"),
        (["--model", "random:llama-3.1-8b", "--layers", "40"], r"layers must be an integer from 1 to 32"),
        (["--model", "random:qwen2.5-7b", "--width", "8"], r"width: width must be one of 1, 2, 4 for qwen2.5-7b"),
        (["--layers", "2"], r"layers: layers shrinks a random:<architecture> model only, not 'smollm2-135m-instruct'"),
        (["--width", "2"], r"width: width shrinks a random:<architecture> model only"),
        (["--model", "random:mistral-7b", "--lengths", "40000"], r"lengths must be <= \d+ for random:mistral-7b"),
    ],
)  # fmt: skip
def test_bad_random_options_fail_before_a_model_is_built(monkeypatch, args, match) -> None:
    def forbidden(*a, **k):
        raise AssertionError("a model was built before the options were checked")

    monkeypatch.setattr("lorekv.cost.run_bench", forbidden)
    monkeypatch.setattr("lorekv.models.architectures.random_model", forbidden)
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert re.search(match, result.output), result.output


def test_the_help_lists_every_shipped_architecture() -> None:
    from lorekv.models.architectures import published_architectures

    output = CliRunner().invoke(app, ["bench", "--help"], terminal_width=200).output
    assert all(f"random:{name}" in output for name in published_architectures()), output
