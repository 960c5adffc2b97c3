"""The causal softmax attention of a captured layer, recomputed for the scorers.

Everything is computed in the capture's dtype promoted to at least float32 (:func:`compute_dtype`):
bf16/fp16 captures are scored in float32, float64 captures (tests, numerical checks) in float64.

For query head h (KV head g = h // group), query t of future m attends to every key whose
position is <= the query's position (prompt keys first, then the future's own response keys):

    a_j = softmax_j(scaling * q . k_j)   over the visible keys j,
    o   = sum_j a_j v_j                  (prompt and response values alike).

Only the n prompt tokens are eviction candidates, but the response keys take part in the
normalisation of a and in o. GQA is handled by splitting the query heads into
(KV head, head-in-group) with einops instead of copying each KV head ``group`` times.

Centring. The deletion scorers need v_j - o, which is unchanged when the same vector c is
subtracted from every value of a KV head and from the outputs of that head's query heads
(sum_j a_j = 1, so o - c = sum_j a_j (v_j - c)). Values often share a large common component
(a v_proj bias, large activations), and the dot-product expansion of ||v_j - o||^2 then cancels
catastrophically. The output is therefore formed from the centred values,
o - c_g = sum_j a_j (v_j - c_g) with c_g the mean prompt value of KV head g (in the compute
dtype), so that the scorers never subtract two large vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from einops import rearrange

from lorekv.trajectories import LayerCapture


@dataclass(frozen=True)
class PromptTerms:
    """The query-independent tensors of one layer's prompt, formed once per layer.

    :meth:`lorekv.scorers.base.Scorer.score_layer` scores a layer's queries in chunks; what does
    not depend on the queries (the centre, the centred values, a scorer's per-token terms) is
    computed here once and read by every chunk, rather than once per chunk.

    Attributes:
        centre: (G, d) c_g, the mean prompt value of each KV head, in the compute dtype.
        centred_values: (G, n, d) v_j - c_g in the compute dtype (possibly a view into
            ``augmented``, whose first d columns they are).
        augmented: (G, n, d + k + 1) rows [u_j, u_j^T M_1 u_j .. u_j^T M_k u_j, 1] of the
            deletion scorers' distance expansion (see :func:`lorekv.scorers.loo.distance_terms`);
            None for scorers that need no distances.
        gram: (H, d, d) the metrics M_h = G_h of projected LOO; None for the plain metric.
    """

    centre: torch.Tensor
    centred_values: torch.Tensor
    augmented: torch.Tensor | None = None
    gram: torch.Tensor | None = None


@dataclass(frozen=True)
class CausalAttention:
    """Attention weights and outputs of one layer, per query head.

    The tensors are stored head-major, (H, M, T, ...) contiguous, and shown as (M, H, T, ...)
    views: with H outermost, the queries of one KV head over every future and query form one
    matrix, so a product with the prompt's (G, n, d) keys or values is a single batched GEMM
    over the G KV heads, with neither the queries' weights nor the prompt copied per future.

    Attributes:
        weights: (M, H, T, n+R) softmax weights a; 0 on keys the query cannot see.
            Each row sums to 1 over prompt and response keys.
        visible: (T, n+R) bool, query t may attend to key j.
        prompt_length: n; keys ``0..n-1`` are the prompt tokens.
        logits: (M, H, T, n+R) scaling * q . k_j, -inf on keys the query cannot see.
        layer: the capture the attention was computed from (its values, for :meth:`combine`).
        centre: (G, d) c_g, the mean prompt value of each KV head in the compute dtype (zeros
            for an empty prompt): the common shift removed from the values, see the module docstring.
        centred_values: (G, n, d) v_j - c_g, the prompt values centred, in the compute dtype;
            None with ``centred_output`` (attention mass needs neither).
        centred_output: (M, H, T, d) o - c_g = sum_j a_j (v_j - c_g) for query head h of KV
            head g, formed from the centred values; None when not asked for (attention mass
            needs only the weights). A query that sees no key has a zero centred output.
    """

    weights: torch.Tensor
    visible: torch.Tensor
    prompt_length: int
    logits: torch.Tensor
    layer: LayerCapture
    centre: torch.Tensor
    centred_values: torch.Tensor | None
    centred_output: torch.Tensor | None

    @property
    def output(self) -> torch.Tensor | None:
        """(M, H, T, d) the attention output o = sum_j a_j v_j (zero for a query that sees no key).

        Adding c back rounds o to the precision of c: the deletion scorers use
        :attr:`centred_output` instead.
        """
        if self.centred_output is None:
            return None
        shift = self.centre.to(self.centred_output.dtype)[None, :, None, None, :]  # (1, G, 1, 1, d)
        total = split_heads(self.weights.sum(dim=-1, keepdim=True), self.layer.num_kv_heads)
        return merge_heads(split_heads(self.centred_output, self.layer.num_kv_heads) + total * shift)

    def centred_prompt_values(self) -> torch.Tensor:
        """(G, n, d) v_j - c_g, the prompt values in the compute dtype, centred per KV head
        (formed once per attention: every use reads the same tensor)."""
        if self.centred_values is None:
            raise ValueError("this attention was computed without outputs (causal_attention(..., output=False))")
        return self.centred_values

    @property
    def prompt_weights(self) -> torch.Tensor:
        """(M, H, T, n) the weights on the prompt keys."""
        return self.weights[..., : self.prompt_length]

    @property
    def response_weights(self) -> torch.Tensor:
        """(M, H, T, R) the weights on each future's own keys."""
        return self.weights[..., self.prompt_length :]

    def combine(self, weights: torch.Tensor) -> torch.Tensor:
        """(M, H, T, d) sum_j w_j (v_j - c_g) for weights (M, H, T, n+R) over [prompt, response] values.

        The values are centred by :attr:`centre` (KV head g of query head h); for weights that
        sum to 1 this is the weighted mean of the values minus c_g. The prompt's values are
        shared by the M futures and are never copied per future: the prompt part is one GEMM
        per KV head over all of its queries (free of copies when ``weights`` is a head-major
        view, as this class's are). The result is a view of a head-major tensor.
        """
        layer, n = self.layer, self.prompt_length
        dtype = weights.dtype
        g, r = layer.num_kv_heads, layer.group_size
        h, m, t = weights.shape[1], weights.shape[0], weights.shape[2]
        torch._check(h == g * r)  # for torch.compile's symbolic shapes: the heads split evenly
        prompt_values = self.centred_prompt_values().to(dtype)
        head_major = weights.transpose(0, 1)  # (H, M, T, n+R)
        prompt = torch.matmul(head_major[..., :n].reshape(g, r * m * t, n), prompt_values)
        out = prompt.reshape(h, m, t, prompt_values.shape[-1])
        s = layer.response_values.shape[2]
        if s > 0:
            own_values = layer.response_values.to(dtype) - self.centre.to(dtype)[None, :, None, :]
            own_weights = rearrange(head_major[..., n:], "(g r) m t s -> m g (r t) s", g=g)
            own = rearrange(torch.matmul(own_weights, own_values), "m g (r t) d -> (g r) m t d", r=r)
            out = out + own
        return out.transpose(0, 1)

    @property
    def lone_query(self) -> torch.Tensor:
        """(T,) bool: the query sees exactly one key (it then holds all the weight, a = 1)."""
        return self.visible.sum(dim=-1) == 1


def causal_attention(layer: LayerCapture, *, output: bool = True, terms: PromptTerms | None = None) -> CausalAttention:
    """Recompute the layer's causal attention in :func:`compute_dtype`.

    Args:
        layer: queries (M, H, T, d), prompt keys (G, n, d) shared by the futures, response keys
            (M, G, R, d), visibility (T, n+R) via ``layer.visible()``.
        output: also form the centred values and outputs.
        terms: the layer's :class:`PromptTerms` when already formed (a chunk of a layer's
            queries: :meth:`lorekv.scorers.base.Scorer.score_layer`); None forms them here.

    Returns:
        The weights (M, H, T, n+R), the centre c (G, d) and, with ``output``, the centred
        values (G, n, d) and outputs (M, H, T, d). A query that sees no key at all (position < 0) gets all-zero
        weights and a zero output. The prompt keys are never copied per future: the queries of
        each KV head, over every future, meet its prompt keys in one GEMM, and the response
        logits are computed apart and joined.
    """
    dtype = compute_dtype(layer)
    queries = scaled_queries(layer, dtype)  # (H, M, T, d)
    hidden = ~layer.visible()
    if terms is None:
        centre = value_centre(layer, dtype)
        centred = layer.prompt_values.to(dtype) - centre[:, None, :] if output else None
    else:
        centre, centred = terms.centre, terms.centred_values
    logits = prompt_logits(layer, queries)
    if layer.response_keys.shape[2] > 0:
        logits = torch.cat([logits, own_logits(layer, queries)], dim=-1)
    logits = logits.masked_fill_(hidden, float("-inf"))
    weights = torch.softmax(logits, dim=-1).masked_fill_(hidden, 0.0)
    attention = CausalAttention(
        weights=weights.transpose(0, 1),
        visible=~hidden,
        prompt_length=layer.prompt_length,
        logits=logits.transpose(0, 1),
        layer=layer,
        centre=centre,
        centred_values=centred if output else None,
        centred_output=None,
    )
    return replace(attention, centred_output=attention.combine(attention.weights)) if output else attention


def prompt_attention_weights(layer: LayerCapture) -> torch.Tensor:
    """(M, H, T, n) the causal softmax weights of the prompt keys alone, as :func:`causal_attention`'s
    :attr:`~CausalAttention.prompt_weights`, without the weights of the response keys.

    a_j = exp(l_j - lse) with lse the log-sum-exp over every key the query sees, the prompt's
    and the future's own: the response keys enter through their log-sum-exp only, so neither a
    (n + R)-wide copy nor a softmax over it is formed (a reconstruction's R is about n). Where the
    pass recorded its log-sum-exps (:attr:`~lorekv.trajectories.LayerCapture.lse`) they are read
    instead of recomputed: the own keys' always; the prompt's where the queries see the prompt
    causally (``visible_spans`` None), which for a recorded pass means all of it (its queries
    come after the prompt), so the prompt logits are the only ones formed, with no mask: one GEMM
    and one exp. Queries with ``visible_spans`` (a reconstruction's chunks) form logits on the
    prompt keys they see only (:meth:`~lorekv.trajectories.LayerCapture.visible_prompt_keys`:
    a chunk and the sinks, not the whole prompt). A query that sees no key gets zeros. A view of a
    head-major (H, M, T, n) tensor."""
    n = layer.prompt_length
    queries = scaled_queries(layer, compute_dtype(layer))  # (H, M, T, d)
    recorded = None if layer.lse is None else layer.lse.to(queries.dtype).transpose(0, 1)  # (H, M, T, 2)
    if layer.visible_spans is None:
        columns = None
        prompt = prompt_logits(layer, queries)
        if recorded is not None:
            total = torch.logaddexp(recorded[..., 0], recorded[..., 1]).unsqueeze(-1)  # (H, M, T, 1)
            return prompt.sub_(total).exp_().transpose(0, 1)
        seen = layer.visible_at(torch.arange(n))
    else:
        columns = layer.visible_prompt_keys()  # (c,)
        prompt = prompt_logits(layer, queries, columns)  # (H, M, T, c)
        seen = layer.visible_at(columns)
    prompt = prompt.masked_fill_(~seen, float("-inf"))
    total = torch.logsumexp(prompt, dim=-1, keepdim=True)
    if recorded is not None:
        total = torch.logaddexp(total, recorded[..., 1:])
    elif layer.response_keys.shape[2] > 0:
        own_seen = layer.visible_at(torch.arange(n, layer.num_keys))
        own = own_logits(layer, queries).masked_fill_(~own_seen, float("-inf"))
        total = torch.logaddexp(total, torch.logsumexp(own, dim=-1, keepdim=True))
    weights = prompt.sub_(total).exp_().masked_fill_(~seen, 0.0)  # unseen keys, and queries without keys
    if columns is not None and columns.numel() < n:
        weights = weights.new_zeros(*weights.shape[:-1], n).index_copy_(-1, columns, weights)
    return weights.transpose(0, 1)


def prompt_logits(layer: LayerCapture, queries: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
    """(H, M, T, n) the scaled logits of ``queries`` (H, M, T, d) on the prompt keys, or (H, M, T, c)
    on the prompt keys ``columns`` (c,) only: one GEMM per KV head over all of its queries, the
    keys never copied per future (nothing masked)."""
    h, m, t, d = queries.shape
    g, r = layer.num_kv_heads, layer.group_size
    torch._check(h == g * r)  # for torch.compile's symbolic shapes: the heads split evenly
    keys = layer.prompt_keys if columns is None else layer.prompt_keys.index_select(1, columns)
    keys = keys.to(queries.dtype).transpose(1, 2)
    return torch.matmul(queries.reshape(g, r * m * t, d), keys).reshape(h, m, t, -1)


def own_logits(layer: LayerCapture, queries: torch.Tensor) -> torch.Tensor:
    """(H, M, T, R) the scaled logits of ``queries`` (H, M, T, d) on each future's own keys (nothing masked)."""
    own_queries = rearrange(queries, "(g r) m t d -> m g (r t) d", g=layer.num_kv_heads)
    own = torch.matmul(own_queries, layer.response_keys.to(queries.dtype).transpose(2, 3))
    return rearrange(own, "m g (r t) s -> (g r) m t s", r=layer.group_size)


def scaled_queries(layer: LayerCapture, dtype: torch.dtype) -> torch.Tensor:
    """(H, M, T, d) the layer's queries times its softmax scale, head-major and contiguous, in ``dtype``."""
    return layer.queries.to(dtype).transpose(0, 1).contiguous() * layer.scaling


def value_centre(layer: LayerCapture, dtype: torch.dtype) -> torch.Tensor:
    """(G, d) c_g = mean over the prompt tokens of v_{g,j}, in ``dtype`` (zeros when n = 0).

    Any shared vector leaves v_j - o unchanged; the mean is the one that makes the centred
    values as small as they can be on average, which is what the expansion's accuracy depends on.
    """
    values = layer.prompt_values.to(dtype)
    return values.sum(dim=1) / max(layer.prompt_length, 1)


def compute_dtype(layer: LayerCapture) -> torch.dtype:
    """The dtype scores are computed in: the queries' dtype, at least float32."""
    return torch.promote_types(layer.queries.dtype, torch.float32)


def split_heads(per_query_head: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """(M, H, ...) -> (M, G, group, ...): query head h = g * group + r goes to [g, r]."""
    return rearrange(per_query_head, "m (g r) ... -> m g r ...", g=num_kv_heads)


def merge_heads(grouped: torch.Tensor) -> torch.Tensor:
    """(M, G, group, ...) -> (M, H, ...), the inverse of :func:`split_heads`."""
    return rearrange(grouped, "m g r ... -> m (g r) ...")
