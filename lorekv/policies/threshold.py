"""Keep what scores above a threshold, and always a recent window (KVzap's and kvpress's ThresholdPress)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import field_validator

from lorekv.policies.base import POLICIES, Policy, PolicyConfig
from lorekv.policies.topk import priority, selection_from_mask, top_k_mask
from lorekv.scores import Scores, Selection


class ThresholdConfig(PolicyConfig):
    """Attributes:
    threshold: τ on the log scale of the scores: a token is kept where log U >= τ (a fitted
        surrogate's predicted log score, as KVzap's threshold; -4 in its paper's examples).
        Finite.
    budget: a cap, not a target: at most L * G * min(B, n) entries are kept in all (the best, on
        one ranking across layers and heads, as the ``global`` policy); B >= n never binds.
    recent: the last ``recent`` prompt tokens are always kept (KVzap's sliding window, 128 in
        kvpress).
    """

    name: Literal["threshold"] = "threshold"
    threshold: float

    @field_validator("threshold")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"threshold must be a finite number (a log score), got {value!r}")
        return value


@POLICIES.register(ThresholdConfig)
class ThresholdPolicy(Policy):
    """kept[l, g] = the protected tokens and every j with log U[l, g, j] >= τ, capped at
    L * G * min(B, n) entries in all.

    KVzap ("KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", https://arxiv.org/abs/2601.07891)
    prunes the tokens whose predicted log score falls below τ, outside a window of the last
    ``recent`` tokens (kvpress's ``ThresholdPress``): how many a head keeps adapts to the
    context, and different heads and layers keep different numbers. lorekv adds the cap B
    (kvpress has none), so that a threshold run can be compared at a stated budget and the
    cache's size is bounded whatever the scores: where more than L * G * min(B, n) entries pass,
    the cap keeps the highest (ties: lower layer, head, then token). With B >= n the rule is
    KVzap's alone, and B >= n does not keep everything here, unlike the other policies.
    """

    config: ThresholdConfig

    @property
    def normalises_scores(self) -> bool:
        return True  # compared on the log scale: the scores must be non-negative

    def select(self, scores: Scores) -> Selection:
        """The kept tokens for finite scores (L, G, n), whatever the budget (see the class docstring)."""
        self.check(scores)
        return self.choose(scores)

    def choose(self, scores: Scores) -> Selection:
        cfg = self.config
        layers, heads, n = scores.values.shape
        key = priority(scores.values, *self.protected(scores))
        passing = torch.log(key) >= cfg.threshold  # +inf on protected tokens; log 0 = -inf fails
        capped = top_k_mask(key.reshape(1, -1), layers * heads * min(cfg.budget, n)).view(layers, heads, n)
        return selection_from_mask(passing & capped, scores.layer_indices)
