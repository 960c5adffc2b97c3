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
from einops import einsum, rearrange

from lorekv.trajectories import LayerCapture


@dataclass(frozen=True)
class CausalAttention:
    """Attention weights and outputs of one layer, per query head.

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
        shared by the M futures and are never copied per future.
        """
        layer, n = self.layer, self.prompt_length
        dtype = weights.dtype
        g = layer.num_kv_heads
        prompt_values = self.centred_prompt_values().to(dtype)
        own_values = layer.response_values.to(dtype) - self.centre.to(dtype)[None, :, None, :]
        prompt = einsum(split_heads(weights[..., :n], g), prompt_values, "m g r t n, g n d -> m g r t d")
        own = einsum(split_heads(weights[..., n:], g), own_values, "m g r t s, m g s d -> m g r t d")
        return merge_heads(prompt + own)

    @property
    def lone_query(self) -> torch.Tensor:
        """(T,) bool: the query sees exactly one key (it then holds all the weight, a = 1)."""
        return self.visible.sum(dim=-1) == 1


def causal_attention(layer: LayerCapture, *, output: bool = True) -> CausalAttention:
    """Recompute the layer's causal attention in :func:`compute_dtype`.

    Args:
        layer: queries (M, H, T, d), prompt keys (G, n, d) shared by the futures, response keys
            (M, G, R, d), visibility (T, n+R) via ``layer.visible()``.

    Returns:
        The weights (M, H, T, n+R), the centre c (G, d) and, with ``output``, the centred
        values (G, n, d) and outputs (M, H, T, d). A query that sees no key at all (position < 0) gets all-zero
        weights and a zero output. The prompt keys are never copied per future: prompt and
        response logits are computed apart and joined.
    """
    dtype = compute_dtype(layer)
    g = layer.num_kv_heads
    queries = split_heads(layer.queries.to(dtype) * layer.scaling, g)
    visible = layer.visible()
    centre = value_centre(layer, dtype)
    logits = torch.cat(
        [
            einsum(queries, layer.prompt_keys.to(dtype), "m g r t d, g n d -> m g r t n"),
            einsum(queries, layer.response_keys.to(dtype), "m g r t d, m g s d -> m g r t s"),
        ],
        dim=-1,
    ).masked_fill_(~visible, float("-inf"))
    weights = torch.softmax(logits, dim=-1).masked_fill_(~visible, 0.0)
    attention = CausalAttention(
        weights=merge_heads(weights),
        visible=visible,
        prompt_length=layer.prompt_length,
        logits=merge_heads(logits),
        layer=layer,
        centre=centre,
        centred_values=layer.prompt_values.to(dtype) - centre[:, None, :] if output else None,
        centred_output=None,
    )
    return replace(attention, centred_output=attention.combine(attention.weights)) if output else attention


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
