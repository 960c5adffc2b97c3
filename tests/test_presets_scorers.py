"""The baseline presets with scorers of their own (Knorm, random) against their reference rules.

As in ``test_presets.py``: the references read the model's own queries, keys and values
(recorded from its eager attention, :mod:`recording`), recompute everything in float64 with
explicit loops, and select as the reference code does at capacity C = B + 1 (query-aware: the
re-fed last token is kept on top of B) or C = B (query-agnostic). Ties go to the lower index.
Nothing here goes through lorekv's scorers or policies.
"""

from __future__ import annotations

import math

import pytest
import torch
from recording import reference
from tiny_models import random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf import evictable_layers

N = 60
GROUP = 2  # tiny_llama: 4 query heads over 2 KV heads
MODES = pytest.mark.parametrize("query_aware", [True, False], ids=["query-aware", "query-agnostic"])


def setup(seed: int):
    model = tiny_llama(300 + seed, layers=3)
    ids = random_ids(N, seed=400 + seed)
    return model, ids, reference(model, ids)


def ranked(values: list[float]) -> list[int]:
    """Indices by decreasing value, ties to the lower index."""
    return sorted(range(len(values)), key=lambda j: (-values[j], j))


def top(values, k: int) -> set[int]:
    return set(ranked([float(v) for v in values])[: max(k, 0)])


def kept(compressed) -> list[list[set[int]]]:
    return [[set(h.tolist()) for h in heads] for heads in compressed.selection.indices]


def reference_capacity(budget: int, query_aware: bool) -> int:
    return budget + 1 if query_aware else budget


def as_candidates(sets: list[list[set[int]]], query_aware: bool) -> list[list[set[int]]]:
    """Reference sets over the prompt -> sets over lorekv's candidates (the re-fed token removed)."""
    return [[s - {N - 1} if query_aware else s for s in heads] for heads in sets]


# ---------------------------------------------------------------------------------------------
# Knorm


@MODES
def test_knorm_keeps_the_lowest_key_norms(query_aware: bool) -> None:
    """kvpress KnormPress: per KV head, the C keys of lowest L2 norm (recorded post-RoPE keys;
    RoPE keeps norms). Query-aware mode keeps the re-fed last token whatever its norm."""
    model, ids, recs = setup(1)
    budget = 17
    expected = []
    for layer in evictable_layers(model):
        keys = recs[layer]["key"][:, :N].double()  # (G, n, d)
        heads = []
        for g in range(keys.shape[0]):
            norms = [math.sqrt(sum(float(x) ** 2 for x in keys[g, j])) for j in range(N)]
            if query_aware:
                heads.append(top([-v for v in norms[: N - 1]], budget) | {N - 1})
            else:
                heads.append(top([-v for v in norms], budget))
        expected.append(heads)
    compressed = Pipeline.from_config(preset("knorm", budget)).compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates(expected, query_aware)
    assert any(heads[0] != heads[1] for heads in expected), "test needs heads that keep different tokens"


# ---------------------------------------------------------------------------------------------
# random


def documented_draws(seed: int, layer_idx: int, kv_heads: int) -> torch.Tensor:
    """(G, n) the draws the ``random`` scorer documents: float32 torch.rand from a CPU generator
    seeded with seed * 2**16 + layer index."""
    generator = torch.Generator().manual_seed(seed * 2**16 + layer_idx)
    return torch.rand(kv_heads, N, generator=generator, dtype=torch.float32)


@MODES
@pytest.mark.parametrize("seed", [0, 7])
def test_random_keeps_the_top_of_its_documented_draws(query_aware: bool, seed: int) -> None:
    model, ids, _ = setup(2)
    budget = 13
    candidates = N - 1 if query_aware else N
    config = preset("random", budget, seed=seed)
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
    layers = evictable_layers(model)
    expected = [
        [top(row[:candidates].tolist(), budget) for row in documented_draws(seed, layer, 2)] for layer in layers
    ]
    assert kept(compressed) == expected
    assert compressed.selection.counts().tolist() == [[budget, budget]] * len(layers)
    flat = [s for heads in expected for s in heads]
    assert len({frozenset(s) for s in flat}) == len(flat), "every (layer, head) keeps its own random set"

    again = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
    assert kept(again) == kept(compressed)
    other = Pipeline.from_config(preset("random", budget, seed=seed + 1)).compress(model, ids, query_aware=query_aware)
    assert kept(other) != kept(compressed)
