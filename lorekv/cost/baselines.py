"""transformers' own paths, the baselines lorekv is measured against: the model with SDPA
attention and its own cache (batch-1 decode steps, ``generate``).

Callers switch the model to SDPA for these (:func:`lorekv.hf.using_sdpa`), as
:func:`lorekv.hf.reference_prefill_seconds` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lorekv.hf import cache_argument

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def cache_kwargs(model: PreTrainedModel, cache: Any) -> dict[str, Any]:
    return {cache_argument(type(model)): cache}


@torch.no_grad()
def prefilled_cache(model: PreTrainedModel, ids: torch.Tensor) -> Any:
    """transformers' own cache (a ``DynamicCache``) after a plain forward of ``ids`` (1, n)."""
    out = model(ids, use_cache=True, logits_to_keep=1)
    return out[cache_argument(type(model))]


def snapshot(cache: Any) -> list[dict[str, Any]]:
    """Each layer's state of transformers' ``DynamicCache``, for :func:`restore`.

    Its layers append by binding new tensors (``torch.cat``), never writing into the old ones, so
    their attributes, copied shallowly, are the whole state. ``crop`` cannot undo decoding
    into a sliding-window layer once it holds its window (hybrid models such as Gemma 3)."""
    return [dict(vars(layer)) for layer in cache.layers]


def restore(cache: Any, state: list[dict[str, Any]]) -> None:
    """Put ``cache``'s layers back as :func:`snapshot` found them (undo decoding into it)."""
    for layer, saved in zip(cache.layers, state, strict=True):
        vars(layer).clear()
        vars(layer).update(saved)


@torch.no_grad()
def decode_steps(model: PreTrainedModel, cache: Any, first: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` batch-1 greedy decode steps through ``model`` and its ``cache``, feeding
    ``first`` (1, 1) then each argmax token; the cache is restored afterwards. Returns the
    last token chosen."""
    state = snapshot(cache)
    token = first
    try:
        for _ in range(steps):
            logits = model(token, use_cache=True, **cache_kwargs(model, cache)).logits
            token = logits[:, -1:].argmax(-1)
        return token
    finally:
        restore(cache, state)


@torch.no_grad()
def generate_tokens(model: PreTrainedModel, ids: torch.Tensor, cache: Any, new_tokens: int) -> torch.Tensor:
    """transformers' ``generate`` (greedy, exactly ``new_tokens`` tokens) for the prompt ``ids``
    (1, n) continuing ``cache`` (which holds a prefix of it, or a compressed cache of it)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        pad_token_id=pad,
        **cache_kwargs(model, cache),
    )


@torch.no_grad()
def generate_from(model: PreTrainedModel, ids: torch.Tensor, cache: Any, new_tokens: int) -> torch.Tensor:
    """:func:`generate_tokens` for the prompt ``ids`` (1, n) whose first n - 1 tokens ``cache``
    (transformers' own) already holds; the cache is restored after."""
    state = snapshot(cache)
    try:
        return generate_tokens(model, ids, cache, new_tokens)
    finally:
        restore(cache, state)
