"""The ``surrogate`` scorer and KVzap's rule: the fitted map of the hidden states the model itself
computes, recorded by the prefill, and the ``kvzap`` preset's kept sets against an independent
implementation of its paper's rule (threshold on the predicted log score, a recent window kept)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from tiny_models import random_ids, surrogate_for, tiny_gemma3, tiny_llama

from lorekv.hf import prepare
from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.scores import Scores


@functools.cache
def llama() -> torch.nn.Module:
    return prepare(tiny_llama(91, layers=3))


def own_predictions(model: torch.nn.Module, ids: torch.Tensor, path: str) -> torch.Tensor:
    """(L, n, G) the map in ``path`` applied to the hidden states entering each layer's attention,
    from the model's own forward pass (its hidden states, then the layer's own input norm) and the
    file's raw tensors."""
    tensors = load_file(path)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
        out = []
        for i, layer in enumerate(model.model.layers):
            h = layer.input_layernorm(hidden[i])[0]
            out.append(h @ tensors[f"maps.{i}.weight"].double().T + tensors[f"maps.{i}.bias"].double())
    return torch.stack(out)


@pytest.mark.parametrize("query_aware", [True, False])
def test_the_scores_are_the_map_of_the_models_own_hidden_states(query_aware: bool) -> None:
    model, ids = llama(), random_ids(23, seed=3)
    path = surrogate_for(model)
    pipeline = Pipeline.from_config(preset("lore_kv_fast", 8, surrogate=path))
    batch = pipeline.prefill(model, ids, query_aware=query_aware)
    futures = pipeline.sampler.futures_batch(batch)[0]
    scores = pipeline.scorer.score(futures)  # (M, L, G, n)
    want = own_predictions(model, ids, path)  # (L, n, G)
    torch.testing.assert_close(scores[0].log(), want.transpose(1, 2), rtol=0, atol=1e-9)
    assert scores.dtype == torch.float64


def independent_kvzap(pred: torch.Tensor, n: int, tail: int, tau: float, window: int, budget: int) -> list[list[int]]:
    """KVzap's rule written out: candidates 0..n-tail-1; keep j where pred[l, j, g] >= tau or j is
    among the last ``window`` prompt tokens; where more than L * G * min(B, c) pass, the highest
    (protected first; ties: lower layer, head, token)."""
    layers, _, heads = pred.shape
    c = n - tail
    entries = []
    for l in range(layers):
        for g in range(heads):
            for j in range(c):
                protected = j >= n - window
                value = float(pred[l, j, g])
                if protected or value >= tau:
                    entries.append((not protected, -value, l, g, j))
    entries.sort()
    kept = entries[: layers * heads * min(budget, c)]
    out = [[[] for _ in range(heads)] for _ in range(layers)]
    for _, _, l, g, j in kept:
        out[l][g].append(j)
    return [sorted(head) for heads_ in out for head in heads_]


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 30),
    quantile=st.floats(0.0, 1.0),
    window=st.integers(0, 6),
    budget=st.integers(1, 40),
    query_aware=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_kvzap_keeps_what_its_rule_keeps(
    n: int, quantile: float, window: int, budget: int, query_aware: bool, seed: int
) -> None:
    model, ids = llama(), random_ids(n, seed=seed)
    path = surrogate_for(model)
    pred = own_predictions(model, ids, path)
    tau = float(torch.quantile(pred.flatten(), quantile)) + 1e-6  # off any prediction's rounding
    config = preset("kvzap", budget, surrogate=path, threshold=tau, window=window)
    tail = int(query_aware)
    protected = min(max(window - tail, 0), n - tail)
    if budget < protected and budget < n - tail:
        with pytest.raises(ValueError, match="smaller than the protected count"):
            Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
        return
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
    got = [sorted(head.tolist()) for heads in compressed.selection.indices for head in heads]
    assert got == independent_kvzap(pred, n, tail, tau, window, budget)


def test_a_surrogate_of_another_model_is_refused_before_any_work() -> None:
    other = prepare(tiny_gemma3(5))
    pipeline = Pipeline.from_config(preset("lore_kv_fast", 4, surrogate=surrogate_for(llama())))
    with pytest.raises(ValueError, match="a surrogate fitted for another model"):
        pipeline.compress(other, random_ids(9), query_aware=False)
    with pytest.raises(ValueError, match="no such file, and not a surrogate shipped with lorekv"):
        Pipeline.from_config(preset("kvzap", 4, surrogate="missing.safetensors"))


def test_the_scorer_refuses_a_capture_without_its_predictions() -> None:
    model, ids = llama(), random_ids(9)
    pipeline = Pipeline.from_config(preset("lore_kv_fast", 4, surrogate=surrogate_for(model)))
    bare = Pipeline.from_config(preset("knorm", 4))  # a prefill that records nothing of the states
    futures = bare.sampler.futures_batch(bare.prefill(model, ids, query_aware=False))[0]
    with pytest.raises(ValueError, match="compress through a Pipeline"):
        pipeline.scorer.score(futures)


@pytest.mark.parametrize("policy", ["uniform", "per_head", "per_layer", "global", "threshold"])
def test_the_surrogate_composes_with_every_policy(policy: str) -> None:
    """Each policy keeps from the surrogate's scores what it keeps from the map's own predictions."""
    model, ids = llama(), random_ids(31, seed=5)
    path = surrogate_for(model)
    fields = {"name": policy, "budget": 6, "recent": 2}
    if policy == "threshold":
        fields["threshold"] = float(own_predictions(model, ids, path).median())
    config = preset("lore_kv_fast", 6, surrogate=path).override({"policy": fields})
    pipeline = Pipeline.from_config(config)
    compressed = pipeline.compress(model, ids, query_aware=False)
    want = pipeline.policy.select(Scores(own_predictions(model, ids, path).exp().permute(0, 2, 1), (0, 1, 2)))
    assert [h.tolist() for hs in compressed.selection.indices for h in hs] == [
        h.tolist() for hs in want.indices for h in hs
    ]
