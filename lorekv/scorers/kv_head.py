"""Scorers defined per KV head, whatever the queries: key norms (Knorm), random draws.

Such a score s[g, j] belongs to KV head g and token j; every query of every future gives it.
:meth:`KVHeadScorer.query_scores` still returns the (M, H, T, n) per-query view (each query
head holds its KV head's scores), but :meth:`KVHeadScorer.score_layer` does not average those
copies back: a mean of ``group`` identical float values need not round back to the value (for
group 3, say), which could turn distinct scores into ties. It hands each KV head's scores to
the shared reductions as one query head with one query, where the query and head reductions
are exact identities; ``kv_heads="shared"`` and ``pool_kernel`` then apply as for any scorer.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from einops import repeat

from lorekv.scorers.base import Scorer
from lorekv.trajectories import LayerCapture


class KVHeadScorer(Scorer):
    """Base of the scorers whose score is a function of the KV head and token only."""

    @abstractmethod
    def kv_head_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(G, n) non-negative scores of the prompt tokens, per KV head, at least float32."""

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n): query head h of future m, query t, holds KV head h // group's scores."""
        m, _, t, _ = layer.queries.shape
        return repeat(self.kv_head_scores(layer), "g n -> m (g r) t n", m=m, r=layer.group_size, t=t)

    def score_layer(self, layer: LayerCapture) -> torch.Tensor:
        """(M, G, n) the per-KV-head scores of one layer, the same for every future."""
        one_query = repeat(self.kv_head_scores(layer), "g n -> m g 1 n", m=layer.num_futures)
        return self.reduce(one_query, layer)  # (M, G, 1, n) read as H = G heads, T = 1 query
