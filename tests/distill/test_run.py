"""``lorekv distill`` on tiny models: what it records is the model's own hidden states and the
teacher's own ranking, the calibration is listed with its digests and split, a rerun resumes from
the finished contexts, and the file it writes drives the ``lore_kv_fast`` preset."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import random_ids, tiny_llama, word_tokenizer
from typer.testing import CliRunner

from lorekv.cli import app
from lorekv.distill import FitReport, Surrogate, fit_linear, load_surrogate, save_surrogate
from lorekv.distill.calibration import CalibrationConfig, Context, contexts
from lorekv.distill.fidelity import fidelity
from lorekv.distill.run import DistillConfig, distill, record_context, split_contexts
from lorekv.hf import prepare
from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.scores import Scores

SMALL = CalibrationConfig(tasks=["variable_tracking", "common_words"], samples=1, haystack=1, length=300)


@functools.cache
def model_and_tokenizer():
    return prepare(tiny_llama(17, layers=2, context=1024)), word_tokenizer()


def test_the_recording_is_the_models_hidden_states_and_the_teachers_ranking() -> None:
    """States: each layer's input norm of the model's own hidden states. Targets: their exp, ranked
    by the teacher's own policy, keeps exactly what the teacher's compress keeps."""
    model, tokenizer = model_and_tokenizer()
    context = Context("random", random_ids(120, seed=3))  # distinct tokens: distinct hidden states
    config = DistillConfig(teacher="kvzip", calibration=SMALL, tokens_per_context=10_000, floor=1e-300)
    teacher = Pipeline.from_config(config.teacher_config())
    states, targets = record_context(model, tokenizer, teacher, context, config)
    n = context.ids.shape[1]
    assert states.shape == (n, 2, 32) and targets.shape == (n, 2, 2)
    with torch.no_grad():
        hidden = model(context.ids, output_hidden_states=True).hidden_states
    for i, layer in enumerate(model.model.layers):
        want = layer.input_layernorm(hidden[i])[0].float()
        torch.testing.assert_close(states[:, i], want, rtol=1e-6, atol=1e-6)
    kept = teacher.policy.select(Scores(targets.double().exp().permute(1, 2, 0), (0, 1)))
    compressed = teacher.compress(model, context.ids, query_aware=False, tokenizer=tokenizer)
    assert [h.tolist() for hs in kept.indices for h in hs] == [
        h.tolist() for hs in compressed.selection.indices for h in hs
    ]


def test_a_fit_lists_its_calibration_resumes_and_drives_lore_kv_fast(tmp_path) -> None:
    model, tokenizer = model_and_tokenizer()
    config = DistillConfig(teacher="kvzip_plus", calibration=SMALL, tokens_per_context=64, held_out=0.34)
    lines: list[str] = []
    out = tmp_path / "fit.safetensors"
    first = distill(config, out, model, tokenizer, log=lines.append)
    found = contexts(SMALL, tokenizer)
    assert [(c["name"], c["sha256"]) for c in first.calibration] == [(c.name, c.sha256) for c in found]
    assert sorted(c["split"] for c in first.calibration) == ["fit", "fit", "held_out"]
    assert first.report.tokens == 64 and len(first.report.layers) == 2
    assert first.teacher == preset("kvzip_plus", 128).model_dump(mode="json")
    assert sum("tokens," in line for line in lines) == 3

    parts = sorted((tmp_path / "fit.safetensors.parts").iterdir())
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # a context killed mid-write is recomputed
    lines.clear()
    again = distill(config, out, model, tokenizer, log=lines.append)
    assert sum("read back" in line for line in lines) == 2 and sum("tokens," in line for line in lines) == 1
    for a, b in zip(first.map.parameters(), again.map.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)

    lines.clear()  # other settings: every context recorded again, none read back
    last = distill(config.model_copy(update={"tokens_per_context": 32}), out, model, tokenizer, log=lines.append)
    assert sum("tokens," in line for line in lines) == 3

    loaded = load_surrogate(out, model)
    assert loaded.calibration == last.calibration
    pipeline = Pipeline.from_config(preset("lore_kv_fast", 16, surrogate=str(out)))
    ids = found[0].ids
    compressed = pipeline.compress(model, ids, query_aware=False)
    assert sum(len(head) for heads in compressed.selection.indices for head in heads) == 2 * 2 * 16


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), held_out=st.floats(0.0, 0.99), seed=st.integers(0, 100))
def test_the_held_out_contexts_are_a_proper_part_in_order(n: int, held_out: float, seed: int) -> None:
    found = [Context(f"c{i}", torch.tensor([[i]])) for i in range(n)]
    fit, held = split_contexts(found, held_out, seed)
    assert sorted(c.name for c in fit + held) == sorted(c.name for c in found)
    assert len(fit) >= 1 and (held_out == 0 or n < 2 or len(held) >= 1)
    assert [c.name for c in fit] == [c.name for c in found if c in fit]
    assert split_contexts(found, held_out, seed) == (fit, held)


def test_the_cli_refuses_a_bad_teacher_before_loading_a_model(tmp_path) -> None:
    result = CliRunner().invoke(app, ["distill", "--teacher", "no_such_method", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "neither a preset" in result.output and "Loading" not in result.output


def test_fidelity_compares_the_student_with_its_teacher_on_one_recording(tmp_path) -> None:
    """On the context it was fitted on, a linear map ranks the tokens as its teacher does; at B = n
    both keep everything."""
    model, tokenizer = model_and_tokenizer()
    context, n = Context("random", random_ids(200, seed=4)), 200
    teacher = Pipeline.from_config(preset("kvzip", 8))
    config = DistillConfig(tokens_per_context=n, floor=1e-30)
    states, targets = record_context(model, tokenizer, teacher, context, config)
    net = fit_linear(states, targets, [0, 1], alpha=1e-3)
    save_surrogate(Surrogate(net, {}, [], FitReport(0, ())), tmp_path / "s.safetensors", model)
    student = Pipeline.from_config(preset("lore_kv_fast", 8, surrogate=str(tmp_path / "s.safetensors")))
    result = fidelity(model, tokenizer, student, teacher, context, [8, n])
    assert result.tokens == n and len(result.spearman) == 2
    assert min(result.spearman) > 0.5
    assert 0 < result.overlap[8] <= 1 and result.overlap[n] == 1.0
    with pytest.raises(ValueError, match="must score with a fitted surrogate"):
        fidelity(model, tokenizer, teacher, teacher, context, [8])


def test_a_benchmark_file_calibrates_each_distinct_context_once() -> None:
    """A suites-format file is a calibration source: its rows' contexts, each listed once (two
    questions of one row share it), named by the file's title and digested by their token ids."""
    from pathlib import Path

    _, tokenizer = model_and_tokenizer()
    path = Path(__file__).parents[1] / "eval" / "suites" / "fixtures" / "jsonl"
    spec = {"format": "jsonl", "path": str(path), "title": "harbour"}
    found = contexts(CalibrationConfig(tasks=[spec], samples=3, haystack=0, length=300), tokenizer)
    assert [c.name for c in found] == ["harbour/notes#0"]  # the first three questions: one row's context
    assert found[0].sha256 == Context("again", found[0].ids.clone()).sha256
    with pytest.raises(ValueError, match="format"):
        CalibrationConfig(tasks=[{"format": "no_such_format", "path": str(path)}])
