"""Leave-one-out (LOO) output deletion: how far does the attention output move without token j?"""

from __future__ import annotations

from typing import Literal

import torch
from einops import einsum, rearrange

from lorekv.scorers.attention import CausalAttention, causal_attention, merge_heads, split_heads
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.trajectories import LayerCapture


class DeletionConfig(ScorerConfig):
    """Config shared by the leave-one-out scorers (the reductions of :class:`ScorerConfig`)."""


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
    scores little.

    Numerics. For every token but the query's most attended prompt token j*, a_j <= 1/2
    (a_j <= a_j* and a_j + a_j* <= 1), so the factor a_j / (1 - a_j) is at most 1 and the norm
    comes from the expansion, on values centred per KV head (c_g = the mean prompt value of KV
    head g, see :mod:`lorekv.scorers.attention`):

        ||v_j - o||^2 = ||v_j - c||^2 - 2 (v_j - c) . (o - c) + ||o - c||^2

    (one n x d product per query, the order of attention itself). Centring is exact in exact
    arithmetic: v_j - o = (v_j - c) - (o - c), and o - c = sum_i a_i (v_i - c) because the
    weights sum to 1, so it is formed from the centred values and never by subtracting c from
    a rounded o. Without it the expansion's three terms are of the size ||c||^2 and cancel to
    ||v_j - o||^2: values sharing a component 100x their spread (a v_proj bias) lose about 4 of
    float32's 7 digits. For j* the closed form cancels: when
    a_j* -> 1 (an attention sink), o -> v_j* and both 1 - a_j* and v_j* - o are rounding noise.
    j* is therefore scored in the equivalent stable form

        s_j* = a_j* * ||v_j* - o_{-j*}||,   o_{-j*} = sum_{i != j*} a_i v_i / sum_{i != j*} a_i,

    (from v_j* - o = (1 - a_j*)(v_j* - o_{-j*})), o_{-j*} being the softmax of the other keys'
    logits applied to their (centred) values: nothing is obtained by subtraction, and it keeps its
    relative accuracy down to 1 - a_j* ~ 1e-9 and below in float32 (and where a_j* rounds to 1).

    Edge cases: a key the query cannot see has a_j = 0 and scores 0. If j is the only key
    the query sees, then a_j = 1 and o = v_j; deleting j leaves nothing to renormalise and
    the score is defined as 0.
    """

    config: LOOConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) LOO deletion scores of the prompt tokens."""
        attention = causal_attention(layer)
        sq_dist = sq_distances(attention.centred_prompt_values(), attention.centred_output)
        return deletion_scores(attention, sq_dist, layer)


def sq_distances(prompt_values: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """||v_j - o||^2 for every query and prompt token, via the dot-product expansion.

    The result depends only on v_j - o, so the values and the outputs may be shifted by any
    common vector c_g per KV head g (the same for the KV head's values and for the outputs of
    its query heads). Its rounding error grows with ||v_j||^2 + ||o||^2, not with the result:
    pass centred values and outputs (:meth:`CausalAttention.centred_prompt_values`,
    :attr:`CausalAttention.centred_output`), as :class:`LOOScorer` does.

    Args:
        prompt_values: (G, n, d) values v_j (- c_g) of the prompt tokens.
        output: (M, H, T, d) attention outputs o (- c_g), H a multiple of G.

    Returns:
        (M, H, T, n) ||v_j||^2 - 2 v_j . o + ||o||^2 (may be slightly negative from rounding).
    """
    grouped = split_heads(output, prompt_values.shape[0])
    value_sq = rearrange(einsum(prompt_values, prompt_values, "g n d, g n d -> g n"), "g n -> g 1 1 n")
    cross = einsum(prompt_values, grouped, "g n d, m g r t d -> m g r t n")
    output_sq = rearrange(einsum(grouped, grouped, "m g r t d, m g r t d -> m g r t"), "m g r t -> m g r t 1")
    return merge_heads(value_sq - 2 * cross + output_sq)


def deletion_scores(
    attention: CausalAttention, sq_distance: torch.Tensor, layer: LayerCapture, gram: torch.Tensor | None = None
) -> torch.Tensor:
    """a_j / (1 - a_j) * sqrt(max(sq_distance, 0)), with each query's dominant token in the stable form.

    Args:
        attention: the layer's attention; weights (M, H, T, n+R), outputs (M, H, T, d).
        sq_distance: (M, H, T, n) squared norm of (a projection of) v_j - o.
        layer: the capture (its values, for the dominant token's o_{-j*}).
        gram: (H, d, d) optional metric G_h; the dominant token's distance is then
            (v_j* - o_{-j*})^T G_h (v_j* - o_{-j*}).

    Returns:
        (M, H, T, n) non-negative scores; 0 for invisible keys and for a query's only key.
    """
    weights = attention.prompt_weights
    factor = weights / (1.0 - weights)
    scores = factor * sq_distance.clamp_min(0.0).sqrt()
    if weights.shape[-1] == 0:
        return scores
    top, top_scores = dominant_scores(attention, layer, gram)
    return scores.scatter(-1, rearrange(top, "m h t -> m h t 1"), rearrange(top_scores, "m h t -> m h t 1"))


def dominant_scores(
    attention: CausalAttention, layer: LayerCapture, gram: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's most attended prompt token j* and its score a_j* ||v_j* - o_{-j*}|| (in G_h's metric).

    o_{-j*} is the attention output with j* deleted, a softmax over the other visible keys'
    logits: it is exact even where their weights under the full softmax underflow to 0. Both
    v_j* and o_{-j*} are taken centred (minus the KV head's c_g, which cancels in the difference).

    Returns:
        top: (M, H, T) long, j* = argmax_j a_j over the prompt keys.
        scores: (M, H, T) the deletion score of j*; 0 when j* is the only key (or no key) the
            query sees.
    """
    g = layer.num_kv_heads
    dtype = attention.weights.dtype
    top = attention.prompt_weights.argmax(dim=-1, keepdim=True)  # (M, H, T, 1)
    a_top = attention.prompt_weights.gather(-1, top).squeeze(-1)
    others = torch.softmax(attention.logits.scatter(-1, top, -torch.inf), dim=-1)
    has_other = rearrange(attention.visible.sum(dim=-1) > 1, "t -> 1 1 t")
    o_minus = attention.combine(others.nan_to_num_(0.0))  # rows with no other key: 0/0, masked below
    kv_head = rearrange(torch.arange(g, device=top.device), "g -> 1 g 1 1")
    v_top = merge_heads(attention.centred_prompt_values().to(dtype)[kv_head, split_heads(top.squeeze(-1), g)])
    diff = v_top - o_minus  # (M, H, T, d)
    if gram is None:
        sq = einsum(diff, diff, "m h t d, m h t d -> m h t")
    else:
        sq = einsum(diff, gram, diff, "m h t d, h d e, m h t e -> m h t")
    return top.squeeze(-1), torch.where(has_other, a_top * sq.clamp_min(0.0).sqrt(), torch.zeros_like(a_top))
