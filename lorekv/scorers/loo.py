"""Leave-one-out (LOO) output deletion: how far does the attention output move without token j?"""

from __future__ import annotations

from typing import Literal

import torch
from einops import rearrange

from lorekv.scorers import base
from lorekv.scorers.attention import (
    CausalAttention,
    PromptTerms,
    causal_attention,
    compute_dtype,
    value_centre,
)
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

    def prompt_terms(self, layer: LayerCapture) -> PromptTerms:
        """The centred values and their squared norms, once per layer (:func:`deletion_terms`)."""
        return deletion_terms(layer)

    def query_scores(self, layer: LayerCapture, terms: PromptTerms | None = None) -> torch.Tensor:
        """(M, H, T, n) LOO deletion scores of the prompt tokens (``terms``: the layer's
        :meth:`prompt_terms`, formed here when None)."""
        terms = self.prompt_terms(layer) if terms is None else terms
        attention = causal_attention(layer, terms=terms)
        return deletion_scores(attention, expanded_sq_distances(terms, attention.centred_output), layer)


def deletion_terms(layer: LayerCapture, gram: torch.Tensor | None = None) -> PromptTerms:
    """The layer's :class:`PromptTerms` for a deletion scorer: centre, centred values and the
    :func:`distance_terms` of the metric (``gram`` (H, d, d); None: the Euclidean one)."""
    dtype = compute_dtype(layer)
    return distance_terms(layer.prompt_values.to(dtype), value_centre(layer, dtype), gram)


def distance_terms(
    values: torch.Tensor, centre: torch.Tensor | None = None, gram: torch.Tensor | None = None
) -> PromptTerms:
    """Per-token terms of ||v_j - o||^2 in the metric M_h (G_h, or the identity), once per layer.

    The expansion (u_j - p)^T M_h (u_j - p) = u_j^T M_h u_j - 2 u_j^T M_h p + p^T M_h p, with
    u_j = v_j - c_g and p = o - c_g, is one inner product of two rows:

        [u_j, u_j^T M_1 u_j, .., u_j^T M_k u_j, 1] . [-2 M_h p, e_h, p^T M_h p],

    e_h selecting the query head's own metric among the k of its KV head (k = 1 for the
    identity, the group size for G_h). The token rows, (G, n, d + k + 1), are formed here; the
    query rows are small; :func:`expanded_sq_distances` then computes every (query, token)
    distance of a KV head in a single GEMM, with no (M, H, T, n) intermediate for the three
    terms. The sum is the same as the expansion's, accumulated in the GEMM.

    Args:
        values: (G, n, d) prompt values (centred already when ``centre`` is None).
        centre: (G, d) c_g subtracted from them, or None.
        gram: (H, d, d) symmetric G_h = W_o^hT W_o^h, or None (the Euclidean metric).

    Returns:
        :class:`PromptTerms` whose ``centred_values`` are the first d columns of ``augmented``.
    """
    g, n, d = values.shape
    k = 1 if gram is None else gram.shape[0] // g
    augmented = values.new_empty((g, n, d + k + 1))
    centred = augmented[..., :d]
    if centre is None:
        centre = values.new_zeros((g, d))
        centred.copy_(values)
    else:
        torch.sub(values, centre[:, None, :], out=centred)
    if gram is None:
        augmented[..., d] = torch.linalg.vecdot(centred, centred)
    else:
        augmented[..., d : d + k] = gram_norms(centred, rearrange(gram, "(g r) d e -> g r d e", g=g)).transpose(1, 2)
    augmented[..., -1] = 1
    return PromptTerms(centre=centre, centred_values=centred, augmented=augmented, gram=gram)


def expanded_sq_distances(terms: PromptTerms, output: torch.Tensor) -> torch.Tensor:
    """(M, H, T, n) (v_j - o)^T M_h (v_j - o) for every query and prompt token (may be slightly
    negative from rounding), from the token rows of :func:`distance_terms` and the (M, H, T, d)
    outputs o - c_g, as one GEMM per KV head; a view of a head-major (H, M, T, n) tensor."""
    augmented = terms.augmented
    g, n, width = augmented.shape
    m, h, t, d = output.shape
    r = h // g
    torch._check(h == g * r)  # for torch.compile's symbolic shapes: the heads split evenly
    centred = output.transpose(0, 1).reshape(g, r, m * t, d)
    if terms.gram is None:
        metric_output = centred
        selector = centred.new_ones((g, r, m * t, 1))
    else:
        metric_output = torch.matmul(centred, rearrange(terms.gram, "(g r) d e -> g r d e", g=g))
        selector = torch.eye(r, dtype=centred.dtype, device=centred.device)[None, :, None, :].expand(g, r, m * t, r)
    output_sq = torch.linalg.vecdot(metric_output, centred).unsqueeze(-1)
    rows = torch.cat([-2 * metric_output, selector, output_sq], dim=-1).reshape(g, r * m * t, width)
    return torch.matmul(rows, augmented.transpose(1, 2)).reshape(h, m, t, n).transpose(0, 1)


def sq_distances(prompt_values: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """||v_j - o||^2 for every query and prompt token, via the dot-product expansion.

    The result depends only on v_j - o, so the values and the outputs may be shifted by any
    common vector c_g per KV head g (the same for the KV head's values and for the outputs of
    its query heads). Its rounding error grows with ||v_j||^2 + ||o||^2, not with the result:
    pass centred values and outputs (:meth:`CausalAttention.centred_prompt_values`,
    :attr:`CausalAttention.centred_output`), as :class:`LOOScorer` does (through
    :func:`distance_terms` and :func:`expanded_sq_distances`, which this calls).

    Args:
        prompt_values: (G, n, d) values v_j (- c_g) of the prompt tokens.
        output: (M, H, T, d) attention outputs o (- c_g), H a multiple of G.

    Returns:
        (M, H, T, n) ||v_j||^2 - 2 v_j . o + ||o||^2 (may be slightly negative from rounding).
    """
    return expanded_sq_distances(distance_terms(prompt_values), output)


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
    scores = sq_distance.clamp_min(0.0).sqrt() * weights / (1.0 - weights)
    if weights.shape[-1] == 0:
        return scores
    top, top_scores = dominant_scores(attention, layer, gram)
    return scores.scatter(-1, top.unsqueeze(-1), top_scores.unsqueeze(-1))


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
    m, h, t, _ = attention.weights.shape
    torch._check(h == g * layer.group_size)  # for torch.compile's symbolic shapes: the heads split evenly
    dtype = attention.weights.dtype
    prompt_weights = attention.prompt_weights.transpose(0, 1)  # (H, M, T, n)
    top = prompt_weights.argmax(dim=-1, keepdim=True)
    a_top = prompt_weights.gather(-1, top).squeeze(-1)
    others = torch.softmax(attention.logits.transpose(0, 1).scatter(-1, top, -torch.inf), dim=-1)
    o_minus = attention.combine(others.nan_to_num_(0.0).transpose(0, 1)).transpose(0, 1)  # no other key: 0/0
    values = attention.centred_prompt_values().to(dtype)
    index = top.reshape(g, -1, 1).expand(-1, -1, values.shape[-1])
    diff = (values.gather(1, index).reshape(o_minus.shape) - o_minus).reshape(h, m * t, -1)  # (H, M*T, d)
    metric_diff = diff if gram is None else torch.matmul(diff, gram)
    sq = torch.linalg.vecdot(metric_diff, diff).reshape(h, m, t)
    has_other = attention.visible.sum(dim=-1) > 1
    scores = torch.where(has_other, a_top * sq.clamp_min(0.0).sqrt(), torch.zeros_like(a_top))
    return top.squeeze(-1).transpose(0, 1), scores.transpose(0, 1)


def gram_norms(prompt_values: torch.Tensor, grouped_gram: torch.Tensor) -> torch.Tensor:
    """(G, group, n) u_j^T G_h u_j for every query head h of each KV head and every prompt token.

    G_h u_j, (H, n, d) at once (group / 2 times one layer's keys and values), is formed over blocks of
    at most :data:`~lorekv.scorers.base.SCORE_CHUNK` elements or the layer's keys and values
    (2 G n d, as :func:`~lorekv.scorers.base.chunk_elements`), whichever is larger: a few blocks
    whatever n is.

    Args:
        prompt_values: (G, n, d) u_j.
        grouped_gram: (G, group, d, d) G_h for h = g * group + r.
    """
    g, r, d, _ = grouped_gram.shape
    block = max(1, base.chunk_elements(prompt_values) // (g * r * d))
    if prompt_values.shape[1] <= block:
        return _gram_norms(prompt_values, grouped_gram)
    return _blocked_gram_norms(prompt_values, grouped_gram, block)


def _gram_norms(prompt_values: torch.Tensor, grouped_gram: torch.Tensor) -> torch.Tensor:
    values = prompt_values.unsqueeze(1)  # (G, 1, n, d); G_h symmetric: (G_h u)^T = u^T G_h
    return torch.linalg.vecdot(torch.matmul(values, grouped_gram), values)


@torch.compiler.disable  # a loop over n: compiled, it would specialise on the prompt length
def _blocked_gram_norms(prompt_values: torch.Tensor, grouped_gram: torch.Tensor, block: int) -> torch.Tensor:
    n = prompt_values.shape[1]
    out = prompt_values.new_empty(*grouped_gram.shape[:2], n)
    for start in range(0, n, block):
        out[..., start : start + block] = _gram_norms(prompt_values[:, start : start + block], grouped_gram)
    return out
