"""The strong check of decoding after eviction: the FULL cache with the evicted entries hidden.

transformers' own ``DynamicCache`` holds every prompt entry at its natural position, and the
model's own ``eager_attention_forward`` runs with an additive mask that hides, per layer and KV
head, the entries eviction dropped (registered for the test as an attention function). It shares
no code with lorekv's positioned cache, gather, hooks or position masks, so it pins the
positions of every fed token, the re-fed last prompt token (the first answer token must not come
from the full prefill) and the masking of padded ragged heads.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from recording import attention_function
from transformers import DynamicCache

from lorekv.hf.reference import keep_masks  # noqa: F401  (re-exported for the tests)

REFERENCE = "lorekv_test_masked_eager"
KEEP: dict[int, torch.Tensor] = {}
"""Layer index -> (G, c) bool: which of the first c cache entries the layer keeps."""


def visible(module, query: torch.Tensor, key: torch.Tensor, **kwargs) -> torch.Tensor:
    """(G, q, k) bool: which of a contiguous cache's keys each query sees: causal (and sliding),
    with the entries KEEP drops hidden."""
    q, kv_heads, k = query.shape[2], key.shape[1], key.shape[2]
    seen = torch.ones(kv_heads, q, k, dtype=torch.bool).tril(k - q)
    window = kwargs.get("sliding_window")
    if window is not None:
        seen &= ~torch.ones(q, k, dtype=torch.bool).tril(k - q - window)
    keep = KEEP.get(module.layer_idx)
    if keep is not None:
        seen[:, :, : keep.shape[1]] &= keep.unsqueeze(1)
    return seen


def masked_eager(module, query, key, value, attention_mask, **kwargs):
    """The model's eager attention over a contiguous cache with :func:`visible` applied."""
    heads, kv_heads = query.shape[1], key.shape[1]
    bias = torch.zeros(kv_heads, query.shape[2], key.shape[2], dtype=query.dtype)
    bias = bias.masked_fill(~visible(module, query, key, **kwargs), -torch.inf)
    bias = bias.repeat_interleave(heads // kv_heads, dim=0).unsqueeze(0)
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, bias, **kwargs)


def reference_logits(
    model, prompt: torch.Tensor, keep: dict[int, torch.Tensor], fed: list[torch.Tensor], attention=masked_eager
) -> list:
    """Prefill ``prompt`` (1, c) unmasked, then feed each (1, q) chunk of ``fed`` with ``keep`` applied;
    the float32 logits after each chunk. ``attention``: the masked attention function (the eager one)."""
    cache = DynamicCache(config=model.config)
    out = []
    try:
        with attention_function(model, REFERENCE, attention, mask="eager" if attention is masked_eager else "sdpa"):
            KEEP.clear()
            model(prompt, cache=cache, use_cache=True)
            KEEP.update(keep)
            for chunk in fed:
                out.append(model(chunk, cache=cache, use_cache=True).logits[0, -1].float())
    finally:
        KEEP.clear()
    return out


def reference_generate(model, input_ids: torch.Tensor, compressed, **options: Any):
    """transformers' ``generate`` on the full cache with the evicted entries hidden: the first
    ``compressed.start`` tokens of ``input_ids`` prefilled unmasked, the rest fed by ``generate``
    (returns its dict output, logits and scores included)."""
    cache = DynamicCache(config=model.config)
    try:
        with attention_function(model, REFERENCE, masked_eager):
            KEEP.clear()
            model(input_ids[:, : compressed.start], cache=cache, use_cache=True)
            KEEP.update(keep_masks(compressed))
            return model.generate(
                input_ids,
                cache=cache,
                attention_mask=torch.ones_like(input_ids),
                return_dict_in_generate=True,
                output_logits=True,
                output_scores=True,
                **options,
            )
    finally:
        KEEP.clear()
