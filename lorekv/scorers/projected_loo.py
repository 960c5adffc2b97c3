"""Projected LOO: the leave-one-out output change as the residual stream sees it (LORE-KV)."""

from __future__ import annotations

from typing import Literal

import torch
from einops import einsum, rearrange

from lorekv.scorers import base
from lorekv.scorers.attention import causal_attention, merge_heads, split_heads
from lorekv.scorers.base import SCORERS, Scorer
from lorekv.scorers.loo import DeletionConfig, deletion_scores
from lorekv.trajectories import LayerCapture


class ProjectedLOOConfig(DeletionConfig):
    """Config of :class:`ProjectedLOOScorer`."""

    name: Literal["projected_loo"] = "projected_loo"


@SCORERS.register(ProjectedLOOConfig)
class ProjectedLOOScorer(Scorer):
    """s_j(q) = ||W_o^h (o - o_{-j})||_2 = a_j / (1 - a_j) * ||W_o^h (v_j - o)||_2.

    Same deletion as :class:`~lorekv.scorers.loo.LOOScorer` (o_{-j} = (o - a_j v_j) / (1 - a_j)),
    measured after head h's slice of the output projection, W_o^h = o_proj[:, h*d:(h+1)*d]
    (D x d): what the deletion changes in the residual stream, so directions of value space
    that the projection discards do not count.

    Gram form: with G_h = W_o^hT W_o^h (d x d) and the values centred per KV head (c_g = the
    mean prompt value of KV head g = h // group, see :mod:`lorekv.scorers.attention`),

        ||W_o^h (v_j - o)||^2 = u_j^T G_h u_j - 2 u_j^T G_h p + p^T G_h p,   u_j = v_j - c_g, p = o - c_g.

    Centring is exact in exact arithmetic (u_j - p = v_j - o; p = sum_i a_i (v_i - c_g) as the
    weights sum to 1, and p is formed that way, not by subtracting c_g from a rounded o). It
    matters in floating point: the three terms are of the size ||W_o^h v||^2 and cancel to the
    result, so values sharing a component 100x their spread (a v_proj bias, large activations)
    lose about 4 of float32's 7 digits without it.

    u_j^T G_h u_j and G_h u_j are per token and computed once per head; per query the cost is
    one n x d product, the order of attention itself. No D-dimensional vector is formed per
    (query, token) pair. As for LOO, each query's most attended prompt token j* (the only one
    whose factor a_j / (1 - a_j) can exceed 1) is scored in the stable form
    a_j* ||W_o^h (v_j* - o_{-j*})|| with o_{-j*} summed from the other tokens, which stays
    accurate for attention sinks (1 - a_j* down to 1e-9 and below in float32). Edge cases
    (invisible keys, a lone visible key) are as for LOO.
    """

    config: ProjectedLOOConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) projected LOO deletion scores of the prompt tokens."""
        attention = causal_attention(layer)
        gram = gram_matrices(layer.o_proj.to(attention.centre.dtype), layer.num_heads)
        sq_dist = projected_sq_distances(attention.centred_prompt_values(), attention.centred_output, gram)
        return deletion_scores(attention, sq_dist, layer, gram)


def gram_matrices(o_proj: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(H, d, d) G_h = W_o^hT W_o^h from the (D, H*d) output projection."""
    per_head = rearrange(o_proj, "D (h d) -> h D d", h=num_heads)
    return einsum(per_head, per_head, "h D d, h D e -> h d e")


def projected_sq_distances(prompt_values: torch.Tensor, output: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """||W_o^h (v_j - o)||^2 for every query and prompt token, via the Gram form.

    The result depends only on v_j - o, so the values and the outputs may be shifted by any
    common vector c_g per KV head g (the same for the KV head's values and for the outputs of
    its query heads). Its rounding error grows with ||W_o^h v_j||^2 + ||W_o^h o||^2, not with
    the result: pass centred values and outputs (:meth:`CausalAttention.centred_prompt_values`,
    :attr:`CausalAttention.centred_output`), as :class:`ProjectedLOOScorer` does.

    Args:
        prompt_values: (G, n, d) values v_j (- c_g) of the prompt tokens.
        output: (M, H, T, d) attention outputs o (- c_g), H a multiple of G.
        gram: (H, d, d) symmetric G_h = W_o^hT W_o^h.

    Returns:
        (M, H, T, n) v_j^T G v_j - 2 v_j^T G o + o^T G o (may be slightly negative from rounding).
    """
    num_kv_heads = prompt_values.shape[0]
    grouped_gram = rearrange(gram, "(g r) d e -> g r d e", g=num_kv_heads)
    grouped_output = split_heads(output, num_kv_heads)

    gram_output = einsum(grouped_gram, grouped_output, "g r d e, m g r t e -> m g r t d")
    cross = einsum(prompt_values, gram_output, "g n d, m g r t d -> m g r t n")
    output_sq = einsum(gram_output, grouped_output, "m g r t d, m g r t d -> m g r t")

    value_sq = rearrange(gram_norms(prompt_values, grouped_gram), "g r n -> 1 g r 1 n")
    output_sq = rearrange(output_sq, "m g r t -> m g r t 1")
    return merge_heads(value_sq - 2 * cross + output_sq)


def gram_norms(prompt_values: torch.Tensor, grouped_gram: torch.Tensor) -> torch.Tensor:
    """(G, group, n) u_j^T G_h u_j for every query head h of each KV head and every prompt token.

    G_h u_j, (H, n, d) at once (several times one layer's values), is formed over blocks of at
    most :data:`~lorekv.scorers.base.SCORE_CHUNK` elements, never whole.

    Args:
        prompt_values: (G, n, d) u_j.
        grouped_gram: (G, group, d, d) G_h for h = g * group + r.
    """
    g, r, d, _ = grouped_gram.shape
    block = max(1, base.SCORE_CHUNK // (g * r * d))
    if prompt_values.shape[1] <= block:
        return _gram_norms(prompt_values, grouped_gram)
    return _blocked_gram_norms(prompt_values, grouped_gram, block)


def _gram_norms(prompt_values: torch.Tensor, grouped_gram: torch.Tensor) -> torch.Tensor:
    gram_values = einsum(grouped_gram, prompt_values, "g r d e, g n e -> g r n d")
    return einsum(gram_values, prompt_values, "g r n d, g n d -> g r n")


@torch.compiler.disable  # a loop over n: compiled, it would specialise on the prompt length
def _blocked_gram_norms(prompt_values: torch.Tensor, grouped_gram: torch.Tensor, block: int) -> torch.Tensor:
    n = prompt_values.shape[1]
    out = prompt_values.new_empty(*grouped_gram.shape[:2], n)
    for start in range(0, n, block):
        out[..., start : start + block] = _gram_norms(prompt_values[:, start : start + block], grouped_gram)
    return out
