"""Leave-one-out (LOO) output deletion: how far does the attention output move without token j?"""

from __future__ import annotations

from typing import Literal

import torch
from einops import einsum, rearrange
from pydantic import field_validator

from lorekv.scorers.attention import CausalAttention, causal_attention, merge_heads, split_heads
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.trajectories import LayerCapture
from lorekv.validation import check_in_range


def check_eps(value: float) -> float:
    """Validate the 1 - a_j guard: a float in the open interval (0, 1)."""
    return check_in_range("eps", value, 0.0, 1.0, low_open=True, high_open=True)


class DeletionConfig(ScorerConfig):
    """Config shared by the leave-one-out scorers.

    Attributes:
        eps: lower bound on 1 - a_j in the renormalisation factor a_j / (1 - a_j), in (0, 1).
    """

    eps: float = 1e-6

    @field_validator("eps")
    @classmethod
    def _eps(cls, value: float) -> float:
        return check_eps(value)


class LOOConfig(DeletionConfig):
    """Config of :class:`LOOScorer`."""

    name: Literal["loo"] = "loo"


@SCORERS.register(LOOConfig)
class LOOScorer(Scorer):
    """s_j(q) = ||o - o_{-j}||_2 = a_j / (1 - a_j) * ||v_j - o||_2.

    Derivation: with o = sum_i a_i v_i, deleting key j renormalises the remaining weights by
    1 / (1 - a_j), so

        o_{-j} = sum_{i != j} a_i v_i / (1 - a_j) = (o - a_j v_j) / (1 - a_j),
        o - o_{-j} = (o (1 - a_j) - o + a_j v_j) / (1 - a_j) = a_j / (1 - a_j) * (v_j - o).

    Unlike attention mass, this credits a token only as far as removing it actually changes
    what the head outputs: a heavily attended token whose value equals the output anyway
    scores little. The norm is computed without forming v_j - o per (query, token):
    ||v_j - o||^2 = ||v_j||^2 - 2 v_j . o + ||o||^2 (clamped at 0), one n x d product per
    query. That expansion has an absolute float32 rounding error of order
    eps32 * ||v_j||^2, i.e. sqrt(eps32) * ||v_j|| on the norm, which the factor
    a_j / (1 - a_j) would amplify for a heavily attended token (a sink with a_j = 0.999 would
    get a few per cent of noise). Only a token with a_j > 1/2 has a factor above 1, and at most
    one prompt token per query can, so for each query's most attended prompt token the norm
    is recomputed directly from v_j - o (O(d) per query); every other token keeps the
    expansion with a factor <= 1. 1 - a_j is guarded by ``eps``: the factor never exceeds
    a_j / eps.

    Edge cases: a key the query cannot see has a_j = 0 and scores 0. If j is the only key
    the query sees, then a_j = 1 and o = v_j; deleting j leaves nothing to renormalise and
    the score is defined as 0 (the exact value of the guarded formula, a_j / eps * 0).
    """

    config: LOOConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) LOO deletion scores of the prompt tokens."""
        attention = causal_attention(layer)
        values = layer.prompt_values.to(attention.output.dtype)
        sq_dist = sq_distances(values, attention.output)
        sq_dist = refine_dominant(sq_dist, values, attention)
        return deletion_scores(attention, sq_dist, self.config.eps)


def sq_distances(prompt_values: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """||v_j - o||^2 for every query and prompt token, via the dot-product expansion.

    Args:
        prompt_values: (G, n, d) values v_j of the prompt tokens.
        output: (M, H, T, d) attention outputs o, H a multiple of G.

    Returns:
        (M, H, T, n) ||v_j||^2 - 2 v_j . o + ||o||^2 (may be slightly negative from rounding).
    """
    grouped = split_heads(output, prompt_values.shape[0])
    value_sq = rearrange(einsum(prompt_values, prompt_values, "g n d, g n d -> g n"), "g n -> g 1 1 n")
    cross = einsum(prompt_values, grouped, "g n d, m g r t d -> m g r t n")
    output_sq = rearrange(einsum(grouped, grouped, "m g r t d, m g r t d -> m g r t"), "m g r t -> m g r t 1")
    return merge_heads(value_sq - 2 * cross + output_sq)


def refine_dominant(
    sq_distance: torch.Tensor, prompt_values: torch.Tensor, attention: CausalAttention, gram: torch.Tensor | None = None
) -> torch.Tensor:
    """Recompute the squared distance of each query's most attended prompt token directly.

    Args:
        sq_distance: (M, H, T, n) squared distances from the expansion.
        prompt_values: (G, n, d) values v_j of the prompt tokens.
        attention: the layer's attention (prompt weights (M, H, T, n), outputs (M, H, T, d)).
        gram: (H, d, d) optional metric G_h: the distance is (v_j - o)^T G_h (v_j - o) instead
            of ||v_j - o||^2.

    Returns:
        (M, H, T, n) ``sq_distance`` with entry j* = argmax_j a_j of every query replaced by the
        value computed from the difference v_j* - o (accurate when a_j* -> 1, where the
        expansion cancels).
    """
    if sq_distance.shape[-1] == 0:
        return sq_distance
    num_kv_heads = prompt_values.shape[0]
    top = split_heads(attention.prompt_weights.argmax(dim=-1), num_kv_heads)  # (M, G, r, T)
    kv_head = rearrange(torch.arange(num_kv_heads, device=top.device), "g -> 1 g 1 1")
    diff = prompt_values[kv_head, top] - split_heads(attention.output, num_kv_heads)  # (M, G, r, T, d)
    if gram is None:
        top_sq = einsum(diff, diff, "m g r t d, m g r t d -> m g r t")
    else:
        grouped_gram = rearrange(gram, "(g r) d e -> g r d e", g=num_kv_heads)
        top_sq = einsum(diff, grouped_gram, diff, "m g r t d, g r d e, m g r t e -> m g r t")
    index = rearrange(merge_heads(top), "m h t -> m h t 1")
    return sq_distance.scatter(-1, index, rearrange(merge_heads(top_sq), "m h t -> m h t 1"))


def deletion_scores(attention: CausalAttention, sq_distance: torch.Tensor, eps: float) -> torch.Tensor:
    """a_j / max(1 - a_j, eps) * sqrt(max(sq_distance, 0)), 0 for queries that see one key.

    Args:
        attention: the layer's attention; its prompt weights a_j are (M, H, T, n).
        sq_distance: (M, H, T, n) squared norm of (a projection of) v_j - o.
        eps: lower bound on 1 - a_j.

    Returns:
        (M, H, T, n) non-negative scores.
    """
    weights = attention.prompt_weights
    factor = weights / (1.0 - weights).clamp_min(eps)
    distance = sq_distance.clamp_min(0.0).sqrt()
    lone = rearrange(attention.lone_query, "t -> t 1")
    return torch.where(lone, torch.zeros_like(distance), factor * distance)
