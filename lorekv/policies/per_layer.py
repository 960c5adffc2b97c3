"""Per-layer budgets: a pyramid schedule (PyramidKV) or an adaptive, score-driven one."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

import torch
from pydantic import field_validator

from lorekv.policies.base import POLICIES, Policy, PolicyConfig, check_protected_fits
from lorekv.policies.topk import (
    cap_and_redistribute,
    largest_remainder,
    priority,
    protected_count,
    selection_from_mask,
    top_k_mask,
)
from lorekv.scores import Scores, Selection
from lorekv.validation import check_in_range


class PerLayerConfig(PolicyConfig):
    """Attributes:
    schedule: ``"pyramid"`` (fixed, linearly decreasing) or ``"adaptive"`` (from the scores).
    beta: pyramid steepness, the first-to-last ratio is B_max : B_min with B_min = B / beta;
        in (1, inf).
    floor_frac: adaptive floor, every layer keeps at least ceil(floor_frac * B) tokens per
        head; in [0, 1].
    """

    name: Literal["per_layer"] = "per_layer"
    schedule: Literal["pyramid", "adaptive"] = "pyramid"
    beta: float = 20.0
    floor_frac: float = 0.2

    @field_validator("beta")
    @classmethod
    def _beta(cls, value: float) -> float:
        return check_in_range("beta", value, 1.0, math.inf, low_open=True, high_open=True)

    @field_validator("floor_frac")
    @classmethod
    def _floor_frac(cls, value: float) -> float:
        return check_in_range("floor_frac", value, 0.0, 1.0)


def pyramid_budgets(num_layers: int, budget: int, beta: float, num_tokens: int) -> list[int]:
    """Per-layer budgets of the PyramidKV schedule, capped at n.

    b_l = B_max - (B_max - B_min) * l / (L - 1) with B_min = B / beta and B_max = 2B - B_min
    (b_0 = B when L = 1), so sum_l b_l = L * B; rounded by largest remainder (exact, on
    fractions) to integers with the same sum, then capped at n with the excess handed to the
    uncapped layers (:func:`~lorekv.policies.topk.cap_and_redistribute`). The result is
    non-increasing over layers and sums to min(L * B, L * n). When B / beta < 1 the last
    layers may round to 0 kept tokens; with sink/recent > 0 the policy raises instead.
    """
    b = Fraction(budget)
    low = b / Fraction(beta)
    high = 2 * b - low
    if num_layers == 1:
        quotas = [b]
    else:
        quotas = [high - (high - low) * Fraction(layer, num_layers - 1) for layer in range(num_layers)]
    return cap_and_redistribute(largest_remainder(quotas, num_layers * budget), num_tokens)


def adaptive_budgets(values: torch.Tensor, budget: int, floor_frac: float, sink: int, recent: int) -> list[int]:
    """Per-layer budgets from where the scores put their mass, capped at n.

    Each head's scores (values: (L, G, n), non-negative) are normalised to sum 1, protected
    tokens get +inf, and the L * G * B largest entries over all layers and heads are picked
    jointly (ties: lower layer, head, token first). Layer l's share is s_l = count_l / G. With
    the floor f = max(ceil(floor_frac * B), p), p = min(sink + recent, n), the budgets are

        B_l = f + (L * B - L * f) * e_l / sum_k e_k,   e_l = max(s_l - f, 0)

    (B_l = s_l when no layer falls below the floor), rounded by largest remainder to keep the
    exact sum L * B. Layers whose mass is spread over many tokens win budget from layers that
    concentrate it on a few.
    """
    num_layers, num_heads, n = values.shape
    key = priority(values, sink, recent, normalize=True)
    picked = top_k_mask(key.flatten(), num_layers * num_heads * budget).view(num_layers, -1)
    shares = [Fraction(c, num_heads) for c in picked.sum(dim=1).tolist()]
    floor = max(math.ceil(round(floor_frac * budget, 9)), protected_count(n, sink, recent))
    excess = [max(s - floor, Fraction(0)) for s in shares]
    spare = num_layers * (budget - floor)
    total_excess = sum(excess, Fraction(0))
    if total_excess == 0:
        quotas = [Fraction(floor)] * num_layers
    else:
        quotas = [floor + spare * e / total_excess for e in excess]
    return cap_and_redistribute(largest_remainder(quotas, num_layers * budget), n)


@POLICIES.register(PerLayerConfig)
class PerLayerPolicy(Policy):
    """Per-layer budgets B_l with sum_l B_l = L * B; each head of layer l keeps its top-B_l.

    The schedule is ``pyramid`` (PyramidKV: more tokens in early layers, where attention is
    broad; :func:`pyramid_budgets`) or ``adaptive`` (from the scores themselves;
    :func:`adaptive_budgets`). B_l is capped at n; when B >= n everything is kept. Every B_l
    below n must hold the protected tokens, or ``select`` raises.
    """

    config: PerLayerConfig

    @property
    def normalises_scores(self) -> bool:
        return self.config.schedule == "adaptive"

    def layer_budgets(self, scores: Scores) -> list[int]:
        """B_l per layer (validated), summing to min(L * B, L * n)."""
        self.check(scores)
        if self.config.budget >= scores.num_tokens:
            return [scores.num_tokens] * scores.num_layers
        return self._schedule(scores)

    def _schedule(self, scores: Scores) -> list[int]:
        """B_l for checked scores and B < n; each must hold the protected tokens."""
        cfg = self.config
        n = scores.num_tokens
        if cfg.schedule == "pyramid":
            budgets = pyramid_budgets(scores.num_layers, cfg.budget, cfg.beta, n)
        else:
            budgets = adaptive_budgets(scores.values, cfg.budget, cfg.floor_frac, cfg.sink, cfg.recent)
        knob = f"beta={cfg.beta}" if cfg.schedule == "pyramid" else f"floor_frac={cfg.floor_frac}"
        for layer, b in enumerate(budgets):
            where = f" of layer {layer} ({cfg.schedule} schedule from budget={cfg.budget}, {knob})"
            check_protected_fits(b, n, cfg, where)
        return budgets

    def choose(self, scores: Scores) -> Selection:
        """Selection with B_l tokens in every head of layer l."""
        key = priority(scores.values, self.config.sink, self.config.recent)
        per_layer = torch.tensor(self._schedule(scores), device=key.device).view(-1, 1)
        return selection_from_mask(top_k_mask(key, per_layer), scores.layer_indices)
