"""Checks of what is fed to a model, run before any model work: token ids and context length."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from lorekv.hf.introspection import max_positions


def vocabulary_size(model: PreTrainedModel) -> int:
    """V, the number of rows of the input embedding."""
    return model.get_input_embeddings().num_embeddings


def check_token_ids(model: PreTrainedModel, ids: torch.Tensor, name: str, *, min_length: int = 1) -> None:
    """``ids`` must be a (1, q) integer tensor (not bool) with q >= ``min_length`` and values in [0, V).

    One host read (min and max), outside any loop.
    """
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a (1, n) tensor of token ids, got {type(ids).__name__}")
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(
            f"{name} must have shape (1, n) (batch size 1; batched prompts are not supported), got {tuple(ids.shape)}"
        )
    if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.shape[1] < min_length:
        raise ValueError(f"{name} must hold at least {min_length} token(s), got {ids.shape[1]}")
    if ids.numel():
        vocab = vocabulary_size(model)
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"{name} must lie in [0, {vocab}) (the model's vocabulary), got values in [{low}, {high}]")


def check_context(model: PreTrainedModel, prompt: int, extra: int, what: str = "answer") -> None:
    """``prompt`` positions plus ``extra`` more must fit the model's context (max_position_embeddings)."""
    limit = max_positions(model)
    if limit is not None and prompt + extra > limit:
        raise ValueError(
            f"a prompt of {prompt} tokens plus {extra} {what} tokens needs {prompt + extra} positions; "
            f"the model's context is {limit}"
        )
