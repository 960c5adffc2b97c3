"""What lorekv needs to know about a transformers model: its layer types, the layers it may
evict, its attention modules, its context length, and whether it can be hooked at all."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config (multimodal configs nest it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_types(config: PretrainedConfig) -> list[str]:
    """Each layer's attention type, ``"full_attention"`` or ``"sliding_attention"``.

    Configs without ``layer_types`` are all full attention.
    """
    text = text_config(config)
    return list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)


def layer_windows(config: PretrainedConfig) -> list[int | None]:
    """Each layer's sliding window, None for full-attention layers."""
    window = getattr(text_config(config), "sliding_window", None)
    return [window if t == "sliding_attention" else None for t in layer_types(config)]


def evictable_layers(model: PreTrainedModel) -> list[int]:
    """Full-attention layers; sliding-window layers bound their own cache and are left alone."""
    return [i for i, t in enumerate(layer_types(model.config)) if t == "full_attention"]


def max_positions(model: PreTrainedModel) -> int | None:
    """The model's context length (``max_position_embeddings``), if it declares one."""
    return getattr(text_config(model.config), "max_position_embeddings", None)


def attention_modules(model: PreTrainedModel) -> dict[int, torch.nn.Module]:
    """Layer index -> attention module (the modules holding ``layer_idx`` and a ``scaling``)."""
    return {
        module.layer_idx: module
        for module in model.modules()
        if hasattr(module, "layer_idx") and hasattr(module, "scaling")
    }


def check_supported(model: PreTrainedModel) -> None:
    """Fail early, before any model work, for models lorekv cannot hook into."""
    name = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{name} does not use transformers' attention interface; lorekv needs it to capture queries")
    if getattr(text_config(model.config), "attn_logit_softcapping", None):
        raise ValueError(f"{name} uses attention logit soft-capping, which lorekv does not support")
    layers = evictable_layers(model)
    if not layers:
        raise ValueError(f"{name} has no full-attention layer to evict from")
    modules = attention_modules(model)
    for idx in layers:
        projection = getattr(modules.get(idx), "o_proj", None)
        if not isinstance(projection, torch.nn.Linear):
            raise ValueError(
                f"{name}: layer {idx} has no attention module with an `o_proj` linear layer; "
                "lorekv needs each head's output projection W_o^h"
            )
