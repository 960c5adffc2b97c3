"""Bad input is an early, clear error naming the parameter; nothing is coerced or run first."""

from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, random_ids, tiny_llama

from lorekv import Pipeline, PipelineConfig, decode, generate_full
from lorekv.registry import ComponentConfig


def counting(model) -> list[int]:
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize(
    "part,spec,field",
    [
        ("policy", {"name": "uniform", "budget": True}, "budget"),
        ("policy", {"name": "uniform", "budget": "64"}, "budget"),
        ("policy", {"name": "uniform", "budget": 64.0}, "budget"),
        ("policy", {"name": "uniform", "budget": 8, "sink": True}, "sink"),
        ("policy", {"name": "uniform", "budget": 8, "recent": "2"}, "recent"),
        ("policy", {"name": "per_head", "budget": 8, "normalize": "yes"}, "normalize"),
        ("sampler", {"name": "temperature", "temperature": True}, "temperature"),
        ("sampler", {"name": "nucleus", "top_p": "0.9"}, "top_p"),
        ("sampler", {"name": "temperature", "num_futures": True}, "num_futures"),
        ("aggregator", {"name": "logprob", "beta": False}, "beta"),
        ("sampler", 3, "sampler"),
        ("scorer", {"name": 7}, "scorer name"),
    ],
)
def test_booleans_strings_and_numbers_of_the_wrong_kind_are_refused(part, spec, field) -> None:
    parts = {"sampler": "greedy", "scorer": "loo", "aggregator": "mean", "policy": {"name": "uniform", "budget": 8}}
    parts[part] = spec
    with pytest.raises(ValueError, match=field):
        PipelineConfig.model_validate(parts)


def test_an_integer_is_a_float() -> None:
    config = PipelineConfig(
        sampler={"name": "temperature", "temperature": 1}, scorer="loo", policy={"name": "uniform", "budget": 8}
    )
    assert config.sampler.temperature == 1.0 and isinstance(config.sampler, ComponentConfig)


@pytest.mark.parametrize(
    "ids,match",
    [
        (torch.tensor([[1, 2, VOCAB]]), r"input_ids must lie in \[0, 61\)"),
        (torch.tensor([[1, -2, 3]]), r"input_ids must lie in \[0, 61\)"),
        (torch.tensor([[1.0, 2.0, 3.0]]), "integer token ids"),
        (torch.tensor([[True, False, True]]), "integer token ids"),
    ],
)
def test_token_ids_are_checked_before_model_work(ids, match) -> None:
    model = tiny_llama()
    calls = counting(model)
    pipeline = Pipeline("greedy", "loo", "mean", {"name": "uniform", "budget": 2})
    with pytest.raises(ValueError, match=match):
        pipeline.generate(model, ids, 4)
    with pytest.raises(ValueError, match=match):
        generate_full(model, ids, 4)
    assert not calls


def test_an_unsatisfiable_policy_is_refused_before_prefill() -> None:
    model = tiny_llama()
    calls = counting(model)
    pipeline = Pipeline("greedy", "loo", "mean", {"name": "uniform", "budget": 4, "sink": 3, "recent": 3})
    with pytest.raises(ValueError, match=r"budget 4 is smaller than the protected count"):
        pipeline.compress(model, random_ids(30))
    assert not calls


def test_context_length_is_checked_outside_the_pipeline_too() -> None:
    model = tiny_llama()  # max_position_embeddings = 512
    calls = counting(model)
    with pytest.raises(ValueError, match="context is 512"):
        generate_full(model, random_ids(500), 20)
    compressed = Pipeline("greedy", "loo", "mean", {"name": "uniform", "budget": 4}).compress(
        model, random_ids(490), query_aware=False
    )
    calls.clear()
    with pytest.raises(ValueError, match="context is 512"):
        decode(model, compressed, random_ids(10), 20)
    with pytest.raises(ValueError, match="question_ids"):
        decode(model, compressed, torch.tensor([[VOCAB + 1]]), 2)
    assert not calls


def test_query_agnostic_one_token_prompt_with_a_prompt_window() -> None:
    model = tiny_llama()
    pipeline = Pipeline(
        {"name": "prompt_window", "window": 1}, "attention_mass", "mean", {"name": "uniform", "budget": 4}
    )
    compressed = pipeline.compress(model, random_ids(1), query_aware=False)
    assert compressed.stats.kept == ((1, 1), (1, 1))
    assert len(decode(model, compressed, random_ids(3, seed=1), 2).token_ids) == 2
