"""CriticalKV: attention mass in two stages, the second reweighted by the value's projected L1 norm."""

from __future__ import annotations

import math
from typing import Literal

import torch
from einops import einsum, rearrange, reduce
from pydantic import Field, field_validator

from lorekv.scorers.attention import causal_attention, compute_dtype
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.trajectories import LayerCapture
from lorekv.validation import check_in_range


class CriticalMassConfig(ScorerConfig):
    """Attributes:
    first_stage: b1 >= 0, how many tokens of each KV head stage 1 takes by the base score
        alone, the pinned tokens at or after the first query (a prompt window) included; the
        ``critical_kv`` preset sets it from the budget.
    epsilon: >= 0, added to the base score before the value-norm reweighting of stage 2.
    """

    name: Literal["critical_mass"] = "critical_mass"
    first_stage: int = Field(default=0, ge=0, strict=True)
    epsilon: float = 1e-4

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, value: float) -> float:
        return check_in_range("epsilon", value, 0.0, math.inf, high_open=True)


@SCORERS.register(CriticalMassConfig)
class CriticalMassScorer(Scorer):
    """CriticalKV's two-stage selection, written as one score per (future, KV head, token).

    "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective",
    https://arxiv.org/abs/2502.03805, as kvpress ``CriticalKVPress`` computes it. Per layer and
    future:

    1. Base score s_j: the attention mass a_j of the queries, reduced over the queries and the
       group's query heads and max-pooled over the tokens before the first query exactly as
       :class:`~lorekv.scorers.attention_mass.AttentionMassScorer` (SnapKV with a prompt window).
       Tokens at or after the first query (the window's own tokens) are pinned, as kvpress
       pins SnapKV's window: s_j = 1 + max s over the layer's KV heads and earlier tokens.
    2. Value-projection norm nu[g, j] = mean over the group's query heads h of
       ||W_o^h v_{g,j}||_1 (L1), W_o^h = o_proj[:, h*d:(h+1)*d].
    3. Stage 1: the ``first_stage`` largest s_j of each KV head (ties to the lower index).
       Stage 2: every other token ranks by (s_j + epsilon) * nu[g, j].

    Scores: stage-1 tokens get 1 + s_j (>= 1); stage-2 tokens get (s_j + epsilon) * nu[g, j]
    divided by twice its largest value over the layer's KV heads and tokens (in [0, 1/2]).
    So every stage-1 token outranks every stage-2 token, each stage keeps its own ranking, and
    one positive factor per layer leaves the comparison between heads intact. A top-B with B
    at least the stage-1 count is CriticalKV's selection; kvpress marks stage 1 with the
    largest float instead, which ties them. With ``kv_heads="shared"`` s and nu are both the
    mean over all the layer's query heads. Several futures are scored one by one (each its own
    two stages) before the aggregator combines them.
    """

    config: CriticalMassConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) attention weights on the prompt keys (the base score before reduction)."""
        return causal_attention(layer, output=False).prompt_weights

    def score_layer(self, layer: LayerCapture) -> torch.Tensor:
        """(M, G, n) two-stage scores of one layer: stage 1 in [1, 3], stage 2 in [0, 1/2]."""
        base = super().score_layer(layer)  # (M, G, n): the reduced, pooled attention mass
        norms = value_projection_norms(layer)
        if self.config.kv_heads == "shared":
            norms = norms.mean(dim=0, keepdim=True).expand_as(norms)
        cfg = self.config
        return two_stage_scores(base, norms.to(base), window_start(layer), cfg.first_stage, cfg.epsilon)


def window_start(layer: LayerCapture) -> torch.Tensor:
    """The first token at or after the first query, min(query positions, n) (n: no window), as a
    0-d long tensor on the queries' device: left there, so that no layer waits for a host read."""
    positions = layer.query_positions
    if positions.numel() == 0:
        return positions.new_full((), layer.prompt_length)
    return positions.min().clamp(max=layer.prompt_length)


def value_projection_norms(layer: LayerCapture) -> torch.Tensor:
    """(G, n) nu[g, j] = mean over the group's query heads h of ||W_o^h v_{g,j}||_1.

    One head at a time: the (n, D) projection of one head is the largest tensor formed.
    """
    dtype = compute_dtype(layer)
    per_head = rearrange(layer.o_proj.to(dtype), "D (h d) -> h D d", h=layer.num_heads)
    values = layer.prompt_values.to(dtype)
    norms = torch.stack(
        [
            einsum(per_head[h], values[h // layer.group_size], "D d, n d -> n D").abs().sum(dim=-1)
            for h in range(layer.num_heads)
        ]
    )  # (H, n)
    return reduce(norms, "(g r) n -> g n", "mean", g=layer.num_kv_heads)


def two_stage_scores(
    base: torch.Tensor, norms: torch.Tensor, start: int | torch.Tensor, first_stage: int, epsilon: float
) -> torch.Tensor:
    """CriticalKV's two stages as one ranking (see :class:`CriticalMassScorer`).

    Args:
        base: (M, G, n) base scores s >= 0.
        norms: (G, n) value-projection norms nu >= 0.
        start: tokens ``start..n-1`` are pinned (the prompt window); ``n`` pins none (an int or
            a 0-d tensor on ``base``'s device).
        first_stage: b1, the stage-1 count per KV head (clipped to n).
        epsilon: added to s in stage 2.

    Returns:
        (M, G, n): 1 + s_j on the b1 largest pinned s of each head, (s_j + eps) nu_j scaled to
        [0, 1/2] by one factor per future elsewhere.
    """
    before = torch.arange(base.shape[-1], device=base.device) < start
    top = reduce(base.masked_fill(~before, 0.0), "m g n -> m 1 1", "max")  # s >= 0: 0 for an empty prefix
    pinned = torch.where(before, base, top + 1)
    second = (pinned + epsilon) * norms
    largest = reduce(second, "m g n -> m 1 1", "max")
    second = second / torch.where(largest > 0, 2 * largest, torch.ones_like(largest))
    order = torch.argsort(pinned, dim=-1, descending=True, stable=True)
    first = torch.zeros_like(pinned, dtype=torch.bool).scatter_(-1, order[..., :first_stage], True)
    return torch.where(first, 1 + pinned, second)
