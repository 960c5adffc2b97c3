"""A reference decode for checks outside the test suite: the FULL cache with the evicted entries hidden.

transformers' own ``DynamicCache`` holds every prompt entry at its natural position and an attention
function registered for the call hides, per layer and KV head, the entries eviction dropped, before
plain SDPA. It shares no code with lorekv's positioned cache, gather or position masks, so logits that
agree with lorekv's compressed decode pin the positions and the masking of the compressed cache
(``lorekv gpu-check`` runs it on the device; the test suite has its own copy in tests/masked_reference.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

REFERENCE_NAME = "lorekv_masked_reference"


def keep_masks(compressed) -> dict[int, torch.Tensor]:
    """Layer index -> (G, c) bool, the kept candidates of each evicted layer of a one-row compressed cache."""
    mask = compressed.selection.mask()
    return {layer: mask[row] for row, layer in enumerate(compressed.selection.layer_indices)}


@torch.no_grad()
def masked_full_logits(
    model: PreTrainedModel, prompt: torch.Tensor, keep: dict[int, torch.Tensor], fed: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Prefill ``prompt`` (1, c) unmasked, then feed each (1, q) chunk of ``fed`` with ``keep`` hiding the
    evicted entries of the first c cache positions; the float32 logits of the last token after each chunk."""
    hidden: dict[int, torch.Tensor] = {}

    def masked_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        q, g, k = query.shape[2], key.shape[1], key.shape[2]
        seen = torch.ones(g, q, k, dtype=torch.bool, device=query.device).tril(k - q)
        window = kwargs.get("sliding_window")
        if window is not None:
            seen &= ~torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q - window)
        drop = hidden.get(module.layer_idx)
        if drop is not None:
            seen[:, :, : drop.shape[1]] &= drop.to(query.device).unsqueeze(1)
        group = query.shape[1] // g
        out = F.scaled_dot_product_attention(
            query,
            key.repeat_interleave(group, dim=1),
            value.repeat_interleave(group, dim=1),
            attn_mask=seen.repeat_interleave(group, dim=0).unsqueeze(0),
            scale=scaling,
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(REFERENCE_NAME, masked_sdpa)
    AttentionMaskInterface.register(REFERENCE_NAME, sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(REFERENCE_NAME)
    cache = DynamicCache(config=model.config)
    out = []
    try:
        model(prompt, cache=cache, use_cache=True)
        hidden.update(keep)
        for chunk in fed:
            out.append(model(chunk, cache=cache, use_cache=True).logits[0, -1].float())
    finally:
        model.set_attn_implementation(previous)
    return out
