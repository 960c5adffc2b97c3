"""One threshold across every layer and KV head (KVzip's and kvpress's allocation)."""

from __future__ import annotations

import math
from typing import Literal

from lorekv.policies.base import POLICIES
from lorekv.policies.per_head import PerHeadConfig, PerHeadPolicy
from lorekv.policies.topk import priority, selection_from_mask, top_k_mask
from lorekv.scores import Scores, Selection


class GlobalConfig(PerHeadConfig):
    """Attributes:
    alpha: guaranteed share of the scored budget: every head keeps its p protected tokens and
        at least floor(alpha * (B - p)) scored ones; in [0, 1]. 0 (default): no floor beyond
        the protected tokens, one threshold for all, as KVzip's and kvpress's global ranking.
    normalize: normalise each head's scores to sum 1 before heads and layers compete; False
        (default) compares the raw scores, as KVzip does with its attention maxima. Score
        scales differ across layers for the deletion scorers (LOO, projected LOO), which
        normalising removes.
    """

    name: Literal["global"] = "global"  # type: ignore[assignment]
    alpha: float = 0.0
    normalize: bool = False


@POLICIES.register(GlobalConfig)
class GlobalPolicy(PerHeadPolicy):
    """Top-(L * G * B) across all layers and KV heads jointly, each head guaranteed a floor.

    Which heads and layers matter is decided by the scores alone: with the floor
    f = p + floor(alpha * (B - p)) (p protected candidates), each head first takes its protected
    tokens and its best tokens up to f, then the remaining L * G * (B - f) slots go to the best
    remaining (layer, head, token) triples, on the raw scores or on per-head normalised ones
    (``normalize``). A head keeps between f and n tokens; the total is exactly
    L * G * min(B, n), so B stays the average per KV head. Ties: lower layer, then lower head,
    then lower token. KVzip (https://arxiv.org/abs/2505.23416) and kvpress's KVzip press rank
    every head's scores against one threshold in this way.
    """

    config: GlobalConfig  # type: ignore[assignment]

    def choose(self, scores: Scores) -> Selection:
        """Selection with L * G * B tokens in all."""
        cfg = self.config
        layers, heads, n = scores.values.shape
        key = priority(scores.values, *self.protected(scores), normalize=cfg.normalize)
        guaranteed = top_k_mask(key, self.head_floor(scores))
        joint = key.masked_fill(guaranteed, math.inf).reshape(1, -1)
        keep = top_k_mask(joint, layers * heads * cfg.budget)
        return selection_from_mask(keep.view(layers, heads, n), scores.layer_indices)
