"""The baselines' scorers (key_norm, random, critical_mass) against float64 brute force.

References loop over heads and tokens with explicit index math (KV head g = h // group,
W_o^h = o_proj[:, h*d:(h+1)*d]) and recompute the causal attention from the capture's raw
queries and keys, independently of :mod:`lorekv.scorers.attention`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import CaptureDims, layer_captures, make_capture, make_trajectories, trajectories

from lorekv.scorers import (
    SCORERS,
    CriticalMassConfig,
    CriticalMassScorer,
    KeyNormConfig,
    KeyNormScorer,
    RandomConfig,
    RandomScorer,
)
from lorekv.trajectories import LayerCapture, Trajectories

SETTINGS = settings(deadline=None, max_examples=40)


def one_layer(layer: LayerCapture) -> Trajectories:
    return make_trajectories((layer,))


# ---------------------------------------------------------------------------------------------
# key_norm


def key_norm_reference(layer: LayerCapture) -> torch.Tensor:
    """(G, n) max over the layer of ||k|| minus ||k_{g,j}||, by loops in float64."""
    keys = layer.prompt_keys.double()
    g, n, _ = keys.shape
    norms = [[math.sqrt(sum(float(x) ** 2 for x in keys[h, j])) for j in range(n)] for h in range(g)]
    largest = max(max(row) for row in norms)
    return torch.tensor([[largest - v for v in row] for row in norms], dtype=torch.float64)


@SETTINGS
@given(traj=trajectories())
def test_key_norm_is_the_shifted_negative_norm(traj: Trajectories) -> None:
    scores = KeyNormScorer(KeyNormConfig()).score(traj)  # (M, L, G, n)
    assert scores.shape == (traj.num_futures, len(traj.layers), traj.layers[0].num_kv_heads, traj.prompt_length)
    assert bool((scores >= 0).all())
    for l, layer in enumerate(traj.layers):
        expected = key_norm_reference(layer).float()
        for m in range(traj.num_futures):
            torch.testing.assert_close(scores[m, l], expected, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(layer=layer_captures(dtype=torch.float64))
def test_key_norm_ranks_as_the_lowest_norm_and_ignores_queries_and_values(layer: LayerCapture) -> None:
    scorer = KeyNormScorer(KeyNormConfig())
    scores = scorer.score(one_layer(layer))[0, 0]
    norms = layer.prompt_keys.norm(dim=-1)
    for g in range(layer.num_kv_heads):
        assert torch.argsort(scores[g], descending=True, stable=True).tolist() == sorted(
            range(layer.prompt_length), key=lambda j: (float(norms[g, j]), j)
        )
    other = replace(layer, queries=-layer.queries, prompt_values=layer.prompt_values * 3)
    assert torch.equal(scorer.score(one_layer(other))[0, 0], scores)


@pytest.mark.parametrize("group", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(5))
def test_key_norm_is_exact_per_kv_head_whatever_the_group(group: int, seed: int) -> None:
    """No averaging of the group's copies: the scores are bit-identical to max - norm."""
    layer = make_capture(CaptureDims(2, 3, group, 4, 40, 4, 8, 6), seed)
    norms = torch.linalg.vector_norm(layer.prompt_keys, dim=-1)
    scores = KeyNormScorer(KeyNormConfig()).score(one_layer(layer))
    assert torch.equal(scores, (norms.max() - norms).expand(2, 1, -1, -1))


# ---------------------------------------------------------------------------------------------
# random


@SETTINGS
@given(traj=trajectories(), seed=st.integers(0, 2**32 - 1))
def test_random_scores_are_the_documented_draws(traj: Trajectories, seed: int) -> None:
    scores = RandomScorer(RandomConfig(seed=seed)).score(traj)
    g, n = traj.layers[0].num_kv_heads, traj.prompt_length
    for l, layer in enumerate(traj.layers):
        generator = torch.Generator().manual_seed(seed * 2**16 + layer.layer_idx)
        expected = torch.rand(g, n, generator=generator, dtype=torch.float32)
        for m in range(traj.num_futures):
            assert torch.equal(scores[m, l], expected)
    assert bool((scores >= 0).all() and (scores < 1).all())
    assert torch.equal(RandomScorer(RandomConfig(seed=seed)).score(traj), scores), "reproducible"


def test_random_seeds_and_layers_differ() -> None:
    layer = make_capture(CaptureDims(1, 2, 2, 3, 40, 0, 4, 5), seed=11)
    traj = make_trajectories((layer, replace(layer, layer_idx=1)))
    first = RandomScorer(RandomConfig(seed=3)).score(traj)
    assert not torch.equal(first[:, 0], first[:, 1]), "layers are drawn independently"
    assert not torch.equal(first, RandomScorer(RandomConfig(seed=4)).score(traj))


# ---------------------------------------------------------------------------------------------
# critical_mass


def attention_reference(layer: LayerCapture) -> list:
    """[m][h][t] -> list of n+R float64 causal softmax weights, recomputed with loops."""
    q = layer.queries.double()
    keys = layer.keys().double()
    m_count, heads, t_count, _ = q.shape
    out = []
    for m in range(m_count):
        per_head = []
        for h in range(heads):
            rows = []
            for t in range(t_count):
                position = int(layer.query_positions[t])
                visible = min(position + 1, keys.shape[2])
                logits = [float(q[m, h, t] @ keys[m, h // layer.group_size, j]) * layer.scaling for j in range(visible)]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                rows.append([w / total for w in weights] + [0.0] * (keys.shape[2] - visible))
            per_head.append(rows)
        out.append(per_head)
    return out


def critical_reference(layer: LayerCapture, first_stage: int, eps: float, kernel: int) -> torch.Tensor:
    """(M, G, n) 1 + s on stage 1, (s + eps) nu / (2 max) elsewhere; s pinned at/after the first query."""
    n, group = layer.prompt_length, layer.group_size
    start = min(int(layer.query_positions.min()), n)
    weights = attention_reference(layer)
    t_count = layer.queries.shape[2]
    d = layer.queries.shape[-1]
    w_o = layer.o_proj.double()
    values = layer.prompt_values.double()
    nu = []
    for g in range(layer.num_kv_heads):
        heads = range(g * group, (g + 1) * group)
        nu.append(
            [
                sum(float((w_o[:, h * d : (h + 1) * d] @ values[g, j]).abs().sum()) for h in heads) / group
                for j in range(n)
            ]
        )
    out = torch.zeros(layer.num_futures, layer.num_kv_heads, n, dtype=torch.float64)
    for m in range(layer.num_futures):
        base = []
        for g in range(layer.num_kv_heads):
            heads = range(g * group, (g + 1) * group)
            s = [sum(weights[m][h][t][j] for h in heads for t in range(t_count)) / (group * t_count) for j in range(n)]
            half = kernel // 2
            pooled = [max(s[max(0, j - half) : min(start, j + half + 1)]) for j in range(start)]
            base.append(pooled + s[start:])
        if start < n:
            pin = (max(max(row[:start]) for row in base) if start > 0 else 0.0) + 1
            base = [row[:start] + [pin] * (n - start) for row in base]
        second = [[(base[g][j] + eps) * nu[g][j] for j in range(n)] for g in range(layer.num_kv_heads)]
        largest = max(max(row) for row in second)
        scale = 2 * largest if largest > 0 else 1.0
        for g in range(layer.num_kv_heads):
            first = set(sorted(range(n), key=lambda j: (-base[g][j], j))[:first_stage])
            for j in range(n):
                out[m, g, j] = 1 + base[g][j] if j in first else second[g][j] / scale
    return out


@SETTINGS
@given(
    layer=layer_captures(dtype=torch.float64, max_prompt=36),
    data=st.data(),
    eps=st.sampled_from([0.0, 1e-4, 0.5]),
    kernel=st.sampled_from([1, 3, 7]),
)
def test_critical_mass_equals_the_two_stage_brute_force(
    layer: LayerCapture, data: st.DataObject, eps: float, kernel: int
) -> None:
    first_stage = data.draw(st.integers(0, layer.prompt_length + 2))
    scorer = CriticalMassScorer(CriticalMassConfig(first_stage=first_stage, epsilon=eps, pool_kernel=kernel))
    scores = scorer.score(one_layer(layer))[:, 0]
    torch.testing.assert_close(scores, critical_reference(layer, first_stage, eps, kernel), rtol=1e-9, atol=1e-12)
    assert bool((scores >= 0).all())


@SETTINGS
@given(layer=layer_captures(), data=st.data())
def test_critical_mass_top_k_is_stage_one_then_stage_two(layer: LayerCapture, data: st.DataObject) -> None:
    """Every stage-1 token outranks every stage-2 token; the window (tokens at or after the first
    query) comes first in stage 1, as kvpress pins it."""
    n = layer.prompt_length
    first_stage = data.draw(st.integers(0, n))
    scores = CriticalMassScorer(CriticalMassConfig(first_stage=first_stage)).score(one_layer(layer))[:, 0]
    start = min(int(layer.query_positions.min()), n)
    for m in range(layer.num_futures):
        for g in range(layer.num_kv_heads):
            order = torch.argsort(scores[m, g], descending=True, stable=True).tolist()
            stage_one = set(order[:first_stage])
            assert bool((scores[m, g, list(stage_one)] >= 1).all()) if stage_one else True
            assert bool((scores[m, g, order[first_stage:]] <= 0.5).all())
            window = list(range(start, n))
            assert set(order[: min(first_stage, len(window))]) <= set(window)


@pytest.mark.parametrize("shared", [False, True])
def test_critical_mass_value_norms_follow_shared_heads(shared: bool) -> None:
    layer = make_capture(CaptureDims(2, 3, 2, 3, 30, 3, 4, 5), seed=12)
    config = CriticalMassConfig(first_stage=0, kv_heads="shared" if shared else "separate")
    scores = CriticalMassScorer(config).score(one_layer(layer))[:, 0]
    if shared:
        assert torch.allclose(scores, scores[:, :1].expand_as(scores))
    assert scores.shape == (layer.num_futures, layer.num_kv_heads, layer.prompt_length)


# ---------------------------------------------------------------------------------------------
# registry and configs


@pytest.mark.parametrize(
    "name, cls, config",
    [
        ("key_norm", KeyNormScorer, {}),
        ("random", RandomScorer, {"seed": 5}),
        ("critical_mass", CriticalMassScorer, {"first_stage": 3, "epsilon": 0.01}),
    ],
)
def test_registry_round_trip(name: str, cls: type, config: dict) -> None:
    scorer = SCORERS.build({"name": name, **config})
    assert type(scorer) is cls
    assert SCORERS.build(scorer.config.model_dump()).config == scorer.config
    assert type(SCORERS.build(name)) is cls


@pytest.mark.parametrize(
    "name, field, value",
    [
        ("random", "seed", -1),
        ("random", "seed", 2**32),
        ("random", "seed", 1.0),
        ("critical_mass", "first_stage", -1),
        ("critical_mass", "first_stage", 2.0),
        ("critical_mass", "epsilon", -1e-3),
        ("critical_mass", "epsilon", math.nan),
        ("critical_mass", "epsilon", math.inf),
        ("key_norm", "pool_kernel", 2),
        ("key_norm", "seed", 1),
    ],
)
def test_invalid_configs_name_the_parameter(name: str, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SCORERS.build({"name": name, field: value})
