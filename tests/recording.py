"""The model's own attention, recorded: a reference that goes through none of lorekv's code.

:func:`reference` runs the plain model once with an attention function (registered for the
test) that records what the model's own ``eager_attention_forward`` receives and returns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

RECORD = "lorekv_test_record"


@contextmanager
def attention_function(model, name: str, function: Callable, mask: str = "eager") -> Iterator[None]:
    """Run ``model`` with ``function`` registered as its attention under ``name`` (restored after).

    ``mask`` picks the mask transformers builds for it: ``"eager"`` (additive) or ``"sdpa"`` (bool).
    """
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, eager_mask if mask == "eager" else sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        with torch.no_grad():
            yield
    finally:
        model.set_attn_implementation(previous)


def reference(model, ids: torch.Tensor) -> dict[int, dict[str, object]]:
    """Per layer: the model's own query (H, q, d), key and value (G, q, d), scaling, output (H, q, d),
    and ``attention_input`` (q, D): the hidden states entering the attention, the residual stream
    the model returns (``output_hidden_states``) through the layer's own input norm."""
    records: dict[int, dict[str, object]] = {}

    def recording(module, query, key, value, attention_mask, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        out, _ = eager(module, query, key, value, attention_mask, **kwargs)
        records[module.layer_idx] = {
            "query": query[0], "key": key[0], "value": value[0],
            "scaling": kwargs.get("scaling"), "output": out[0].transpose(0, 1), "o_proj": module.o_proj.weight,
        }  # fmt: skip
        return out, None

    with attention_function(model, RECORD, recording):
        hidden = model(ids, use_cache=False, output_hidden_states=True).hidden_states
        for index, layer in enumerate(model.model.layers):
            records[index]["attention_input"] = layer.input_layernorm(hidden[index])[0].detach()
    return records
