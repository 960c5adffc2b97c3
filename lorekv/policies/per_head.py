"""Per-head budgets within each layer (Ada-KV)."""

from __future__ import annotations

import math
from typing import Literal

from einops import rearrange
from pydantic import field_validator

from lorekv.policies.base import POLICIES, Policy, PolicyConfig
from lorekv.policies.topk import priority, protected_count, selection_from_mask, top_k_mask
from lorekv.scores import Scores, Selection
from lorekv.validation import check_in_range


class PerHeadConfig(PolicyConfig):
    """Attributes:
    alpha: guaranteed share of the scored budget: every head keeps its p protected tokens and
        at least floor(alpha * (B - p)) scored ones (Ada-KV's safeguard); in [0, 1].
    normalize: normalise each head's scores to sum 1 before heads compete, because score
        scales (LOO in particular) differ across heads.
    """

    name: Literal["per_head"] = "per_head"
    alpha: float = 0.2
    normalize: bool = True

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value: float) -> float:
        return check_in_range("alpha", value, 0.0, 1.0)


@POLICIES.register(PerHeadConfig)
class PerHeadPolicy(Policy):
    """Top-(G * B) per layer across its KV heads jointly, each head guaranteed a floor.

    With p protected candidates per head and the floor f = p + floor(alpha * (B - p)): each
    head first takes its protected tokens and its best tokens up to f; the remaining
    G * (B - f) slots of the layer go to the best remaining (head, token) pairs of that layer,
    compared on the raw scores, or on the per-head normalised scores
    v[g, j] = U[g, j] / sum_i U[g, i] when ``normalize`` (a head whose scores sum to 0 counts
    as uniform). Ties: lower head, then lower token first. Every layer keeps exactly
    G * min(B, n) tokens; B >= n keeps everything. This is Ada-KV's allocation in the form
    kvpress implements it (guarantee per head, then one layer-wide top-k).
    """

    config: PerHeadConfig

    def head_floor(self, scores: Scores) -> int:
        """f = p + floor(alpha * (B - p)), the candidates every head is guaranteed (p protected)."""
        p = protected_count(scores.num_tokens, *self.protected(scores))
        return p + math.floor(round(self.config.alpha * (self.config.budget - p), 9))

    @property
    def normalises_scores(self) -> bool:
        return self.config.normalize

    def choose(self, scores: Scores) -> Selection:
        """Selection with G * B tokens per layer."""
        cfg = self.config
        n = scores.num_tokens
        key = priority(scores.values, *self.protected(scores), normalize=cfg.normalize)
        guaranteed = top_k_mask(key, self.head_floor(scores))
        joint = rearrange(key.masked_fill(guaranteed, math.inf), "l g n -> l (g n)")
        keep = top_k_mask(joint, scores.num_kv_heads * cfg.budget)
        return selection_from_mask(rearrange(keep, "l (g n) -> l g n", n=n), scores.layer_indices)
