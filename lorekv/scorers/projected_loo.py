"""Projected LOO: the leave-one-out output change as the residual stream sees it (LORE-KV)."""

from __future__ import annotations

from typing import Literal

import torch
from einops import rearrange

from lorekv.scorers.attention import PromptTerms, causal_attention, compute_dtype
from lorekv.scorers.base import SCORERS, Scorer
from lorekv.scorers.loo import DeletionConfig, deletion_scores, deletion_terms, distance_terms, expanded_sq_distances
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

    G_h and u_j^T G_h u_j do not depend on the queries and are computed once per layer
    (:meth:`prompt_terms`), not once per chunk of queries; per query the cost is one n x d
    product, the order of attention itself, and the three terms come out of one GEMM per KV
    head (:func:`~lorekv.scorers.loo.distance_terms`). No D-dimensional vector is formed per
    (query, token) pair. As for LOO, each query's most attended prompt token j* (the only one
    whose factor a_j / (1 - a_j) can exceed 1) is scored in the stable form
    a_j* ||W_o^h (v_j* - o_{-j*})|| with o_{-j*} summed from the other tokens, which stays
    accurate for attention sinks (1 - a_j* down to 1e-9 and below in float32). Edge cases
    (invisible keys, a lone visible key) are as for LOO.
    """

    config: ProjectedLOOConfig

    def prompt_terms(self, layer: LayerCapture) -> PromptTerms:
        """The Gram matrices, the centred values and u_j^T G_h u_j, once per layer
        (:func:`~lorekv.scorers.loo.deletion_terms`)."""
        return deletion_terms(layer, gram_matrices(layer.o_proj.to(compute_dtype(layer)), layer.num_heads))

    def query_scores(self, layer: LayerCapture, terms: PromptTerms | None = None) -> torch.Tensor:
        """(M, H, T, n) projected LOO deletion scores of the prompt tokens (``terms``: the
        layer's :meth:`prompt_terms`, formed here when None)."""
        terms = self.prompt_terms(layer) if terms is None else terms
        attention = causal_attention(layer, terms=terms)
        sq_dist = expanded_sq_distances(terms, attention.centred_output)
        return deletion_scores(attention, sq_dist, layer, terms.gram)


def gram_matrices(o_proj: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(H, d, d) G_h = W_o^hT W_o^h from the (D, H*d) output projection."""
    per_head = rearrange(o_proj, "D (h d) -> h D d", h=num_heads)
    return torch.matmul(per_head.transpose(1, 2), per_head)


def projected_sq_distances(prompt_values: torch.Tensor, output: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """||W_o^h (v_j - o)||^2 for every query and prompt token, via the Gram form.

    The result depends only on v_j - o, so the values and the outputs may be shifted by any
    common vector c_g per KV head g (the same for the KV head's values and for the outputs of
    its query heads). Its rounding error grows with ||W_o^h v_j||^2 + ||W_o^h o||^2, not with
    the result: pass centred values and outputs (:meth:`CausalAttention.centred_prompt_values`,
    :attr:`CausalAttention.centred_output`), as :class:`ProjectedLOOScorer` does (through
    :func:`~lorekv.scorers.loo.distance_terms` and
    :func:`~lorekv.scorers.loo.expanded_sq_distances`, which this calls).

    Args:
        prompt_values: (G, n, d) values v_j (- c_g) of the prompt tokens.
        output: (M, H, T, d) attention outputs o (- c_g), H a multiple of G.
        gram: (H, d, d) symmetric G_h = W_o^hT W_o^h.

    Returns:
        (M, H, T, n) v_j^T G v_j - 2 v_j^T G o + o^T G o (may be slightly negative from rounding).
    """
    return expanded_sq_distances(distance_terms(prompt_values, gram=gram), output)
