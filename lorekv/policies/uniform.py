"""The same budget for every (layer, KV head)."""

from __future__ import annotations

from typing import Literal

from lorekv.policies.base import POLICIES, Policy, PolicyConfig
from lorekv.policies.topk import check_protected_fits, check_scores, keep_all, priority, selection_from_mask, top_k_mask
from lorekv.scores import Scores, Selection


class UniformConfig(PolicyConfig):
    name: Literal["uniform"] = "uniform"


@POLICIES.register("uniform", UniformConfig)
class UniformPolicy(Policy):
    """Top-B per (layer, KV head), protected tokens included (SnapKV, TOVA, StreamingLLM).

    kept[l, g] = the min(B, n) largest U[l, g, :] after setting the protected tokens'
    scores to +inf. Every head keeps exactly min(B, n) tokens.
    """

    config: UniformConfig

    def select(self, scores: Scores) -> Selection:
        """Selection with min(B, n) tokens per head; scores.values (L, G, n) finite."""
        cfg = self.config
        check_scores(scores, non_negative=False)
        check_protected_fits(cfg.budget, scores.num_tokens, cfg)
        if cfg.budget >= scores.num_tokens:
            return keep_all(scores)
        key = priority(scores.values, cfg.sink, cfg.recent)
        return selection_from_mask(top_k_mask(key, cfg.budget), scores.layer_indices)
