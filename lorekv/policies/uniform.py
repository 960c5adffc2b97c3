"""The same budget for every (layer, KV head)."""

from __future__ import annotations

from typing import Literal

from lorekv.policies.base import POLICIES, Policy, PolicyConfig
from lorekv.policies.topk import priority, selection_from_mask, top_k_mask
from lorekv.scores import Scores, Selection


class UniformConfig(PolicyConfig):
    name: Literal["uniform"] = "uniform"


@POLICIES.register(UniformConfig)
class UniformPolicy(Policy):
    """Top-B per (layer, KV head), protected tokens included (SnapKV, TOVA, StreamingLLM).

    kept[l, g] = the min(B, n) largest U[l, g, :] after setting the protected tokens'
    scores to +inf. Every head keeps exactly min(B, n) tokens.
    """

    config: UniformConfig

    def choose(self, scores: Scores) -> Selection:
        """Selection with B tokens per head."""
        key = priority(scores.values, *self.protected(scores))
        return selection_from_mask(top_k_mask(key, self.config.budget), scores.layer_indices)
