"""The baselines' scorers (key_norm, random) against float64 brute force.

References loop over heads and tokens with explicit index math (KV head g = h // group,
W_o^h = o_proj[:, h*d:(h+1)*d]) and recompute the causal attention from the capture's raw
queries and keys, independently of :mod:`lorekv.scorers.attention`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import CaptureDims, layer_captures, make_capture, make_trajectories, trajectories

from lorekv.scorers import (
    SCORERS,
    KeyNormConfig,
    KeyNormScorer,
    RandomConfig,
    RandomScorer,
)
from lorekv.trajectories import LayerCapture, Trajectories

SETTINGS = settings(deadline=None, max_examples=40)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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
# registry and configs


@pytest.mark.parametrize(
    "name, cls, config",
    [
        ("key_norm", KeyNormScorer, {}),
        ("random", RandomScorer, {"seed": 5}),
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
        ("key_norm", "pool_kernel", 2),
        ("key_norm", "seed", 1),
    ],
)
def test_invalid_configs_name_the_parameter(name: str, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SCORERS.build({"name": name, field: value})
