"""Random scores: the baseline every method must beat (kvpress ``RandomPress``)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from lorekv.scorers.attention import compute_dtype
from lorekv.scorers.base import SCORERS, ScorerConfig
from lorekv.scorers.kv_head import KVHeadScorer
from lorekv.trajectories import LayerCapture

SEED_LIMIT = 2**32
LAYER_LIMIT = 2**16


def layer_seed(seed: int, layer_idx: int) -> int:
    """The generator seed of layer ``layer_idx``: seed * 2^16 + layer_idx, one per (seed, layer)."""
    if not 0 <= layer_idx < LAYER_LIMIT:
        raise ValueError(f"layer_idx must lie in [0, {LAYER_LIMIT}), got {layer_idx}")
    return seed * LAYER_LIMIT + layer_idx


class RandomConfig(ScorerConfig):
    """Attributes:
    seed: integer in [0, 2^32); the same seed gives the same scores on every call and device.
    """

    name: Literal["random"] = "random"
    seed: int = Field(default=0, ge=0, lt=SEED_LIMIT, strict=True)


@SCORERS.register(RandomConfig)
class RandomScorer(KVHeadScorer):
    """s[l, g, j] iid uniform on [0, 1), whatever the query: every head keeps its own random set.

    Layer l draws ``torch.rand(G, n, dtype=float32)`` from a fresh CPU ``torch.Generator``
    seeded with ``seed * 2**16 + layer_idx`` (:func:`layer_seed`), then moves the draws to the
    keys' device and dtype (at least float32): the same seed gives the same scores on every
    call, device and model dtype, and the layers are drawn independently. The draws are
    float32 multiples of 2^-24, so long prompts may hold equal draws; ties go to the lower
    index as everywhere. kvpress ``RandomPress`` draws ``torch.rand`` in the keys' dtype from
    the global generator, reseeded with ``seed`` for every layer, so there every layer of equal
    shape gets the same pattern; lorekv draws each layer independently. Reads no attention.
    """

    config: RandomConfig

    def kv_head_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(G, n) the layer's uniform draws."""
        generator = torch.Generator().manual_seed(layer_seed(self.config.seed, layer.layer_idx))
        draws = torch.rand(layer.num_kv_heads, layer.prompt_length, generator=generator, dtype=torch.float32)
        return draws.to(device=layer.prompt_keys.device, dtype=compute_dtype(layer))
