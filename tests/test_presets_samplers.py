"""The presets that need samplers of their own (H2O, KVzip, LAQ) against brute-force references.

As in :mod:`test_presets`: the references read the model's own queries, keys and values
(recorded from its eager attention, :mod:`recording`, or from the masked eager attention
below), recompute attention in float64 with explicit masks, and apply the paper's rule in
reference terms: a capacity C of kept prompt tokens per head, C = B + 1 in query-aware mode
(the re-fed last token on top), C = B query-agnostic. Selection per KV head from the group's
scores; ties to the lower index.
"""

from __future__ import annotations

import pytest
import torch
from recording import reference
from test_presets import GROUP, MODES, as_candidates, attention_rows, kept, top
from tiny_models import random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf import evictable_layers

N = 60


def group_mean(per_head: torch.Tensor) -> torch.Tensor:
    """(H, n) -> (G, n), the mean over each KV head's query heads."""
    return per_head.view(-1, GROUP, per_head.shape[-1]).mean(dim=1)


# ---------------------------------------------------------------------------------------------
# H2O


@MODES
@pytest.mark.parametrize("budget,recent", [(20, None), (14, 3), (9, 9)])
def test_h2o_equals_the_reference_rule(query_aware: bool, budget: int, recent: int | None) -> None:
    """Accumulated causal attention of ALL n prompt queries (summed), group mean, the last
    ``recent`` prompt tokens + the top C - recent of the tokens before them."""
    model = tiny_llama(111, layers=3)
    ids = random_ids(N, seed=211)
    recs = reference(model, ids)
    r = budget // 2 if recent is None else recent
    capacity = budget + query_aware
    expected = []
    for layer in evictable_layers(model):
        a = attention_rows(recs[layer], range(0, N), N)  # (H, n, n), causal, 0 above the diagonal
        accumulated = group_mean(a.sum(dim=1))  # (G, n), summed over every query
        expected.append([top(s[: N - r], capacity - r) | set(range(N - r, N)) for s in accumulated])
    config = preset("h2o", budget) if recent is None else preset("h2o", budget, recent=recent)
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates(expected, N, query_aware)


def test_h2o_scores_every_prompt_query_in_chunks(monkeypatch) -> None:
    """The prefill captures all n queries; the scorer sees them QUERY_CHUNK at a time."""
    import lorekv.scorers.base as scorer_base
    from lorekv.scorers.attention_mass import AttentionMassScorer

    monkeypatch.setattr(scorer_base, "QUERY_CHUNK", 16)
    seen: list[int] = []
    original = AttentionMassScorer.query_scores

    def spy(self, layer):
        seen.append(layer.queries.shape[2])
        return original(self, layer)

    monkeypatch.setattr(AttentionMassScorer, "query_scores", spy)
    model = tiny_llama(112, layers=2)
    ids = random_ids(40, seed=212)
    compressed = Pipeline.from_config(preset("h2o", 10)).compress(model, ids)
    assert seen == [16, 16, 8] * 2
    assert compressed.stats.kept == ((10, 10), (10, 10))


def test_h2o_recent_must_fit_the_budget() -> None:
    with pytest.raises(ValueError, match="recent"):
        preset("h2o", 8, recent=9)
    assert preset("h2o", 64).policy.recent == 32
    assert preset("h2o", 64).sampler.window == "all"
