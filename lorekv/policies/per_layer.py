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
    beta: pyramid steepness: the last layer keeps (B - p) / beta scored tokens; in (1, inf).
    rounding: how the pyramid is made integer. ``"exact"``: largest remainder, so the total
        is exactly L * B. ``"reference"``: PyramidKV's own integer arithmetic (floored step),
        whose total can exceed L * B by up to about L^2 / 2 tokens.
    floor_frac: adaptive floor, every layer keeps at least ceil(floor_frac * B) tokens per
        head; in [0, 1].
    """

    name: Literal["per_layer"] = "per_layer"
    schedule: Literal["pyramid", "adaptive"] = "pyramid"
    beta: float = 20.0
    rounding: Literal["exact", "reference"] = "exact"
    floor_frac: float = 0.2

    @field_validator("beta")
    @classmethod
    def _beta(cls, value: float) -> float:
        return check_in_range("beta", value, 1.0, math.inf, low_open=True, high_open=True)

    @field_validator("floor_frac")
    @classmethod
    def _floor_frac(cls, value: float) -> float:
        return check_in_range("floor_frac", value, 0.0, 1.0)


def pyramid_budgets(
    num_layers: int,
    budget: int,
    beta: float,
    num_tokens: int,
    *,
    prompt_tokens: int | None = None,
    rounding: Literal["exact", "reference"] = "exact",
) -> list[int]:
    """Scored tokens per layer under the PyramidKV schedule (arXiv 2406.02069).

    ``budget`` B' and ``num_tokens`` n' count the scored (unprotected) tokens: the policy adds
    its p protected tokens to every layer, as PyramidKV keeps its observation window in every
    layer. With b_min = B' / beta and b_max = 2 B' - b_min, layer l of L gets

        b_l = b_max - (b_max - b_min) * l / (L - 1)     (b_0 = B' when L = 1),

    with b_max clipped to n' (then b_min = 2 B' - n'). When the prompt (``prompt_tokens``,
    default n') is shorter than 2 B' the reference falls back to SnapKV, B' in every layer,
    and so does this. ``rounding="exact"`` rounds by largest remainder (exact, on fractions):
    non-increasing, each <= n', summing to L * B'. ``rounding="reference"`` uses PyramidKV's
    integers: b_min = floor(B' / beta), step = floor((b_max - b_min) / (L - 1)),
    b_l = b_max - l * step.
    """
    prompt = num_tokens if prompt_tokens is None else prompt_tokens
    if num_layers == 1 or prompt < 2 * budget:
        return [min(budget, num_tokens)] * num_layers
    if rounding == "reference":
        low = math.floor(budget / beta)
        high = 2 * budget - low
        if high >= num_tokens:
            high, low = num_tokens, 2 * budget - num_tokens
        step = (high - low) // (num_layers - 1)
        return [high - layer * step for layer in range(num_layers)]
    low = Fraction(budget) / Fraction(beta)
    high = 2 * budget - low
    if high >= num_tokens:
        high, low = Fraction(num_tokens), 2 * budget - Fraction(num_tokens)
    quotas = [high - (high - low) * Fraction(layer, num_layers - 1) for layer in range(num_layers)]
    return largest_remainder(quotas, num_layers * budget)


def adaptive_budgets(values: torch.Tensor, budget: int, floor_frac: float, sink: int, recent: int) -> list[int]:
    """Per-layer budgets from where the scores put their mass, capped at n.

    Each head's scores (values: (L, G, n), non-negative) are normalised to sum 1, protected
    tokens get +inf, and the L * G * B largest entries over all layers and heads are picked
    jointly (ties: lower layer, head, token first). Layer l's share is s_l = count_l / G. With
    the floor f = ceil(floor_frac * B), the budgets are

        B_l = f + (L * B - L * f) * e_l / sum_k e_k,   e_l = max(s_l - f, 0)

    (B_l = s_l when no layer falls below the floor), rounded by largest remainder to keep the
    exact sum L * B. Protected tokens win the joint pick in every head, so s_l >= p =
    min(sink + recent, n) and no B_l falls below p. Layers whose mass is spread over many
    tokens win budget from layers that concentrate it on a few.
    """
    num_layers, num_heads, n = values.shape
    key = priority(values, sink, recent, normalize=True)
    picked = top_k_mask(key.flatten(), num_layers * num_heads * budget).view(num_layers, -1)
    shares = [Fraction(c, num_heads) for c in picked.sum(dim=1).tolist()]
    floor = math.ceil(round(floor_frac * budget, 9))
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
    broad; the p protected tokens in every layer and the pyramid over the B - p scored ones,
    :func:`pyramid_budgets`) or ``adaptive`` (from the scores themselves;
    :func:`adaptive_budgets`). B >= n keeps everything. Every B_l below n must hold the
    protected tokens, or ``select`` raises.
    """

    config: PerLayerConfig

    @property
    def normalises_scores(self) -> bool:
        return self.config.schedule == "adaptive"

    def layer_budgets(self, scores: Scores) -> list[int]:
        """B_l per layer (validated); L * B in total (``"reference"`` rounding: about that)."""
        self.check(scores)
        if self.config.budget >= scores.num_tokens:
            return [scores.num_tokens] * scores.num_layers
        return self._schedule(scores)

    def _schedule(self, scores: Scores) -> list[int]:
        """B_l for checked scores and B < n; each must hold the protected tokens."""
        cfg = self.config
        n = scores.num_tokens
        sink, recent = self.protected(scores)
        if cfg.schedule == "pyramid":
            p = protected_count(n, sink, recent)
            scored = pyramid_budgets(
                scores.num_layers, cfg.budget - p, cfg.beta, n - p, prompt_tokens=n + scores.tail, rounding=cfg.rounding
            )
            return [p + b for b in scored]
        budgets = adaptive_budgets(scores.values, cfg.budget, cfg.floor_frac, sink, recent)
        for layer, b in enumerate(budgets):
            where = f" of layer {layer} (adaptive schedule from budget={cfg.budget}, floor_frac={cfg.floor_frac})"
            check_protected_fits(b, n, sink, recent, where)
        return budgets

    def choose(self, scores: Scores) -> Selection:
        """Selection with B_l tokens in every head of layer l."""
        key = priority(scores.values, *self.protected(scores))
        per_layer = torch.tensor(self._schedule(scores), device=key.device).view(-1, 1)
        return selection_from_mask(top_k_mask(key, per_layer), scores.layer_indices)
