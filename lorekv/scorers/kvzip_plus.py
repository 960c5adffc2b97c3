"""KVzip+: attention mass weighted by what the token's value adds to the output, per unit of the query's input."""

from __future__ import annotations

from typing import Literal

import torch
from einops import rearrange

from lorekv.scorers.attention import compute_dtype, prompt_attention_weights
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.trajectories import LayerCapture


class KVzipPlusConfig(ScorerConfig):
    """Config of :class:`KVzipPlusScorer` (only the family's fields)."""

    name: Literal["kvzip_plus"] = "kvzip_plus"


@SCORERS.register(KVzipPlusConfig)
class KVzipPlusScorer(Scorer):
    """s_j(q) = a_j ||W_o^h v_j||_2 / ||h_q||: KVzip+'s normalisation of the attention weight.

    The score KVzap learns to predict (https://arxiv.org/abs/2601.07891; kvpress's
    ``kvzip_plus_normalization``): the softmax weight a_j of prompt token j for query q (as
    ``attention_mass``), divided by ||h_q||, the norm of the hidden state that produced q where
    it enters the attention (after the layer's input norm), and multiplied by ||W_o^h v_j||_2,
    the size of what token j's value adds to head h's output. On KVzip's reconstruction, with
    both reductions ``max``, it is KVzip+. Needs captures that recorded the hidden-state norms
    (``LayerCapture.query_norms``; every rollout of lorekv's binding does).
    """

    config: KVzipPlusConfig
    needs_query_norms = True

    def prompt_terms(self, layer: LayerCapture) -> torch.Tensor:
        """(H, n) ||W_o^h v_j||_2, from the Gram matrices W_o^hᵀ W_o^h (d x d per head), so no
        (n, D) projection is formed."""
        dtype = compute_dtype(layer)
        per_head = rearrange(layer.o_proj.to(dtype), "D (g r d) -> g r D d", g=layer.num_kv_heads, r=layer.group_size)
        gram = torch.einsum("grDd,grDe->grde", per_head, per_head)
        values = layer.prompt_values.to(dtype)
        squared = torch.einsum("gnd,grde,gne->grn", values, gram, values)
        return rearrange(squared.clamp(min=0).sqrt(), "g r n -> (g r) n")

    def query_scores(self, layer: LayerCapture, terms: torch.Tensor | None = None) -> torch.Tensor:
        """(M, H, T, n) the prompt attention weights (:func:`prompt_attention_weights`), normalised."""
        if layer.query_norms is None:
            raise ValueError(
                f"scorer kvzip_plus needs the hidden-state norms of the queries (query_norms); "
                f"layer {layer.layer_idx}'s capture has none (a rollout built with query_norms=True records "
                "them; a Pipeline with this scorer asks for it)"
            )
        weights = prompt_attention_weights(layer)
        value_norms = self.prompt_terms(layer) if terms is None else terms
        inverse = 1.0 / layer.query_norms.to(weights.dtype)
        return weights * inverse[:, None, :, None] * value_norms[None, :, None, :]
