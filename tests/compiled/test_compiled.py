"""``compile=True`` computes what eager computes, and compiles once for every prompt length.

Inductor compiles even a small function in tens of seconds on a 2-core CPU, so these tests are
few and small (marked ``compile``; the mutation check leaves them out).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_ids, tiny_gemma3
from torch._dynamo.utils import counters

from lorekv import Pipeline, preset
from lorekv.scorers.projected_loo import ProjectedLOOConfig, ProjectedLOOScorer
from lorekv.trajectories import LayerCapture, Trajectories

pytestmark = pytest.mark.compile


def capture(n: int, layer_idx: int, seed: int) -> Trajectories:
    """One float64 layer (the dtype of the tiny models, so the pipeline test reuses the kernel)."""
    gen = torch.Generator().manual_seed(seed)
    m, h, g, t, d = 2, 4, 2, 3, 8

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    layer = LayerCapture(
        layer_idx=layer_idx,
        queries=randn(m, h, t, d),
        query_positions=torch.arange(n, n + t),
        prompt_keys=randn(g, n, d),
        prompt_values=randn(g, n, d),
        response_keys=randn(m, g, t, d),
        response_values=randn(m, g, t, d),
        o_proj=randn(16, h * d),
        scaling=d**-0.5,
    )
    zeros = torch.zeros(m, t, dtype=torch.float64)
    return Trajectories(torch.zeros(m, t, dtype=torch.long), zeros, zeros, (layer,), n)


def test_compiled_scorer_equals_eager_and_compiles_once_for_every_length() -> None:
    torch._dynamo.reset()
    counters.clear()
    fast = ProjectedLOOScorer(ProjectedLOOConfig(), compile=True)
    eager = ProjectedLOOScorer(ProjectedLOOConfig())
    graphs = []
    for n, layer_idx in ((9, 0), (17, 3), (33, 1)):
        futures = capture(n, layer_idx, seed=n)
        torch.testing.assert_close(fast.score(futures), eager.score(futures), rtol=1e-9, atol=1e-12)
        graphs.append(counters["stats"]["unique_graphs"])
    assert not counters["graph_break"], f"the kernel does not compile whole: {dict(counters['graph_break'])}"
    assert graphs == [1, 1, 1], "a new prompt length or layer recompiled the kernel"


def test_compiled_pipeline_keeps_what_the_eager_pipeline_keeps() -> None:
    """Hybrid Gemma 3: the compiled cascade attention runs on sliding and full layers, and
    neither the futures' growing length nor a new prompt length recompiles it."""
    model = tiny_gemma3()
    config = preset("lore_kv", 8)
    Pipeline.from_config(config, compile=True).compress(model, random_ids(19, seed=4))
    graphs = counters["stats"]["unique_graphs"]
    # the scorer, and the cascade for full and sliding layers with one own token and with more
    # (dynamo specialises a size of 1); a recompilation at each of the 8 steps would make 17
    assert graphs <= 8, f"{graphs} graphs: a kernel recompiled during one compression"
    ids = random_ids(24, seed=5)
    eager = Pipeline.from_config(config).compress(model, ids)
    fast = Pipeline.from_config(config, compile=True).compress(model, ids)
    assert counters["stats"]["unique_graphs"] == graphs, "a new prompt length recompiled a kernel"
    kept = [[h.tolist() for h in layer] for layer in eager.selection.indices]
    assert [[h.tolist() for h in layer] for layer in fast.selection.indices] == kept
    for a, b in zip(fast.cache.layers, eager.cache.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys)
    torch.testing.assert_close(
        torch.tensor(fast.stats.future_weights), torch.tensor(eager.stats.future_weights), rtol=1e-6, atol=1e-9
    )
