"""Checks of what is fed to a model, run before any model work: token ids and context length."""

from __future__ import annotations

from collections.abc import Sequence

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
            f"{name} must have shape (1, n) (one sequence here; batches go with an attention_mask where "
            f"supported), got {tuple(ids.shape)}"
        )
    if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.shape[1] < min_length:
        raise ValueError(f"{name} must hold at least {min_length} token(s), got {ids.shape[1]}")
    if ids.numel():
        vocab = vocabulary_size(model)
        low, high = torch.stack(torch.aminmax(ids)).tolist()
        if low < 0 or high >= vocab:
            raise ValueError(f"{name} must lie in [0, {vocab}) (the model's vocabulary), got values in [{low}, {high}]")


def left_pad(rows: Sequence[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, N) token ids and attention mask of the (1, n_i) ``rows`` left-padded with ``pad_id`` to
    the longest, the transformers convention for generation (the mask 0 on padding, 1 on tokens)."""
    width = max(r.shape[-1] for r in rows)
    ids = rows[0].new_full((len(rows), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[-1] :] = r.reshape(-1)
        mask[i, width - r.shape[-1] :] = 1
    return ids, mask


def check_context(model: PreTrainedModel, prompt: int, extra: int, what: str = "answer") -> None:
    """``prompt`` positions plus ``extra`` more must fit the model's context (max_position_embeddings)."""
    limit = max_positions(model)
    if limit is not None and prompt + extra > limit:
        raise ValueError(
            f"a prompt of {prompt} tokens plus {extra} {what} tokens needs {prompt + extra} positions; "
            f"the model's context is {limit}"
        )


def check_rows_context(model: PreTrainedModel, positions: Sequence[int], extra: int, what: str = "answer") -> None:
    """Each row of a batch on its own: row i's ``positions[i]`` (its real tokens so far, padding
    not counted) plus ``extra`` more must fit the model's context, as ``model.generate`` checks a
    left-padded batch. The error names the first row that does not fit (one row: no name)."""
    for row, used in enumerate(positions):
        try:
            check_context(model, used, extra, what)
        except ValueError as error:
            raise ValueError(f"row {row}: {error}" if len(positions) > 1 else str(error)) from None


def check_batch(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    name: str = "input_ids",
    *,
    min_length: int = 1,
) -> tuple[int, ...]:
    """The real token count of each row of a left-padded batch ``input_ids`` (b, N).

    ``attention_mask`` (b, N) of 0/1 (or bool) marks the real tokens; every row must be left
    padding (zeros) then at least ``min_length`` real tokens (ones), the transformers convention
    for generation. None: every token is real. One host read of the mask.

    Raises:
        ValueError: ids not a (b, N) integer tensor of the model's vocabulary; a mask of another
            shape, or with other values than 0/1; a row (named) that is not left-padded, all
            padding, or shorter than ``min_length``.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] < 1:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"{name} must be a (b, n) tensor of token ids, got {got}")
    check_token_ids(model, input_ids.reshape(1, -1), name)
    b, width = input_ids.shape
    if attention_mask is None:
        lengths = (width,) * b
    else:
        if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (b, width):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
            raise ValueError(f"attention_mask must have the shape of {name}, ({b}, {width}), got {got}")
        mask = attention_mask.long().cpu()
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
        lengths = tuple(mask.sum(1).tolist())
        for row in range(b):
            if lengths[row] and not bool((mask[row, width - lengths[row] :] == 1).all()):
                raise ValueError(
                    f"attention_mask row {row} is not left padding (zeros, then ones): pad on the left, "
                    "as for generation (tokenizer.padding_side = 'left')"
                )
    for row, n in enumerate(lengths):
        if n < min_length:
            what = "is all padding" if n == 0 else f"holds {n} token(s)"
            raise ValueError(f"{name} row {row} {what}; each row needs at least {min_length}")
    return lengths
