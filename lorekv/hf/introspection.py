"""What lorekv needs to know about a transformers model: its layer types, the layers it may
evict, its attention modules, its context length, and whether it can be hooked at all."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from transformers import PretrainedConfig, PreTrainedModel


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config (multimodal configs nest it)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_types(config: PretrainedConfig) -> list[str]:
    """Each layer's attention type, ``"full_attention"`` or ``"sliding_attention"``.

    Configs without ``layer_types`` follow transformers' convention: a ``sliding_window`` (not
    switched off by ``use_sliding_window=False``) makes every layer sliding-window attention,
    as Mistral and Phi-3 do; otherwise every layer is full attention.
    """
    text = text_config(config)
    declared = getattr(text, "layer_types", None)
    if declared:
        return list(declared)
    sliding = getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True)
    return ["sliding_attention" if sliding else "full_attention"] * text.num_hidden_layers


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


SINK_MODEL_TYPES = frozenset({"gpt_oss"})
"""Model types whose attention adds learned per-head sink logits (``s_aux``) to the softmax."""

QUANTISED_WEIGHT_CLASSES = frozenset({"Params4bit", "Int8Params"})
"""Weight classes (bitsandbytes) that hold a packed or quantised matrix, not W_o itself."""

QUANTISED_LINEAR_CLASSES = frozenset({"Linear4bit", "Linear8bitLt", "LinearFP4", "LinearNF4"})
"""Linear classes (bitsandbytes) whose weight is not the real output projection."""


def attention_sinks(model: PreTrainedModel) -> list[int]:
    """Layers whose attention adds learned sink logits (gpt-oss style ``s_aux``) to the softmax.

    Detected from the attention modules (a ``sinks`` or ``s_aux`` attribute that is set) and,
    should a model name them otherwise, from the config's model type (every layer then).
    """
    modules = attention_modules(model)
    found = [
        idx for idx, m in sorted(modules.items()) if any(getattr(m, a, None) is not None for a in ("sinks", "s_aux"))
    ]
    if not found and getattr(text_config(model.config), "model_type", None) in SINK_MODEL_TYPES:
        found = sorted(modules) or list(range(len(layer_types(model.config))))
    return found


def chunked_attention(config: PretrainedConfig) -> bool:
    """Whether some layer attends within fixed chunks (Llama 4): a ``"chunked_attention"`` layer
    type, or ``attention_chunk_size`` set in the text config (transformers then chunks every
    layer that has no other type)."""
    text = text_config(config)
    return "chunked_attention" in layer_types(config) or getattr(text, "attention_chunk_size", None) is not None


def quantised_projection(projection: torch.nn.Module) -> str | None:
    """Why ``projection`` (an ``o_proj``) does not hold the real (out, in) float matrix, or None.

    The reason completes "o_proj ...", e.g. "is a quantised Linear4bit".

    Catches bitsandbytes' ``Linear4bit``/``Linear8bitLt`` (by class and module name, without
    importing bitsandbytes) and any weight that is not a floating tensor of shape
    (out_features, in_features): packed 4-bit storage (uint8, (n/2, 1)) or int8 codes would
    otherwise be read as W_o and give meaningless projected-LOO scores.
    """
    cls = type(projection)
    if cls.__name__ in QUANTISED_LINEAR_CLASSES or cls.__module__.split(".")[0] == "bitsandbytes":
        return f"is a quantised {cls.__name__}"
    weight = getattr(projection, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return "has no weight tensor"
    if type(weight).__name__ in QUANTISED_WEIGHT_CLASSES or type(weight).__module__.split(".")[0] == "bitsandbytes":
        return f"has a quantised {type(weight).__name__} weight"
    if not weight.is_floating_point():
        return f"has a {weight.dtype} weight (quantised codes)"
    shape = (getattr(projection, "out_features", None), getattr(projection, "in_features", None))
    if tuple(weight.shape) != shape:
        return f"has a weight of shape {tuple(weight.shape)}, not (out_features, in_features) = {shape}"
    return None


def check_supported(model: PreTrainedModel) -> None:
    """Fail early, before any model work, for models lorekv cannot hook into or cannot model.

    Refused, each with a ``ValueError`` naming the feature: no attention interface, logit
    soft-capping, attention sinks (extra softmax terms lorekv's attention and scorers would
    ignore), chunked attention layers (a mask lorekv does not apply), layer types other than
    full and sliding attention, no full-attention layer, and an ``o_proj`` that is missing or
    quantised (the projected scorers need the real W_o^h).
    """
    name = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{name} does not use transformers' attention interface; lorekv needs it to capture queries")
    if getattr(text_config(model.config), "attn_logit_softcapping", None):
        raise ValueError(f"{name} uses attention logit soft-capping, which lorekv does not support")
    sinks = attention_sinks(model)
    if sinks:
        raise ValueError(
            f"{name} uses attention sinks (learned per-head sink logits, s_aux) in layers {sinks}; "
            "lorekv's attention and scores would ignore them, so it does not support them"
        )
    if chunked_attention(model.config):
        raise ValueError(
            f"{name} uses chunked attention (attention_chunk_size / 'chunked_attention' layers), "
            "which lorekv does not support"
        )
    unknown = sorted(set(layer_types(model.config)) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"{name} has layer types {unknown}; lorekv supports full and sliding attention only")
    layers = evictable_layers(model)
    if not layers:
        window = getattr(text_config(model.config), "sliding_window", None)
        raise ValueError(
            f"{name} has no full-attention layer to evict from: every layer uses sliding-window attention "
            f"(window {window}) and already bounds its own cache; lorekv evicts from full-attention layers only"
        )
    modules = attention_modules(model)
    for idx in layers:
        projection = getattr(modules.get(idx), "o_proj", None)
        if not isinstance(projection, torch.nn.Linear):
            raise ValueError(
                f"{name}: layer {idx} has no attention module with an `o_proj` linear layer; "
                "lorekv needs each head's output projection W_o^h"
            )
        problem = quantised_projection(projection)
        if problem is not None:
            raise ValueError(
                f"{name}: layer {idx}'s o_proj {problem}: a quantised or packed weight is not the real "
                "output projection W_o^h that lorekv needs (load the model unquantised)"
            )


def rotary_tables(
    model: PreTrainedModel, layer_idx: int
) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """Positions (P,) -> the (cos, sin) tables, (P, d) float32, that ``model`` rotates layer
    ``layer_idx``'s queries and keys with (its ``rotary_emb``, for that layer's attention type
    where the model has one table per type, as Gemma 3); None for a model without one."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None:
        owners = [module for name, module in model.named_modules() if name.endswith("rotary_emb")]
        if not owners:
            return None
        rotary = owners[0]
    typed = "layer_type" in inspect.signature(rotary.forward).parameters
    options = {"layer_type": layer_types(model.config)[layer_idx]} if typed else {}

    def tables(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # a "dynamic" or "longrope" table rescales itself for long positions: leave it as it was
        state = {key: value.clone() for key, value in rotary.state_dict().items()}
        attributes = {key: value for key, value in vars(rotary).items() if isinstance(value, int | float)}
        try:
            probe = torch.empty(0, dtype=torch.float32, device=positions.device)
            cos, sin = rotary(probe, positions.reshape(1, -1), **options)
        finally:
            rotary.load_state_dict(state, strict=False)
            vars(rotary).update(attributes)
        return cos[0].float(), sin[0].float()

    return tables
