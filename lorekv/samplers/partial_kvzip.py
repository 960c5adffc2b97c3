"""Partial reconstruction: KVzip's repeat-the-context future over a seeded sample of its chunks.

KVzip ("KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
https://arxiv.org/abs/2505.23416; :mod:`lorekv.samplers.kvzip`) teacher-forces the whole
context a second time, chunk by chunk, after a "repeat" instruction: its compression costs a
second pass over the context on top of the prefill (and scoring n repeat queries). This sampler
reconstructs only K of the C = ceil(n / chunk_size) chunks, drawn uniformly without replacement
with a seeded generator (kept in prompt order), so the repeat inputs hold about K/C of the
tokens and the cost of sampling and scoring falls by about that factor.

What it estimates: KVzip's chunked softmax means a repeat query only sees the sinks, its own
chunk and its own repeat input, so a token of a chunk that was not drawn gets no score from
this future (0: the policy keeps it only by its tie order or as a protected token). Alone it
therefore keeps a token of the context with probability about K/C; it is meant as a cheap
complement in a :mod:`~lorekv.samplers.mixture` (e.g. with sampled questions), where the other
futures score the rest. Everything else (instructions, suffix, overlap, sinks, visibility) is
:class:`~lorekv.samplers.kvzip.KVzipSampler`'s.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator

from lorekv.samplers.base import SAMPLERS
from lorekv.samplers.kvzip import KVzipConfig, KVzipSampler


class PartialKVzipConfig(KVzipConfig):
    """Config of :class:`PartialKVzipSampler`: :class:`~lorekv.samplers.kvzip.KVzipConfig`'s
    fields, a smaller default ``chunk_size``, and how many chunks to reconstruct.

    Attributes:
        chunk_size: tokens per chunk (>= 1; 128 by default, so that a context of a few thousand
            tokens has chunks to choose from: KVzip's 2048 gives one).
        fraction: reconstruct K = ceil(fraction * C) of the C chunks (0 < fraction <= 1;
            default 0.25). Exclusive with ``num_chunks``.
        num_chunks: reconstruct K = min(num_chunks, C) chunks (>= 1); None (default): use
            ``fraction``.
        seed: seeds the draw of the chunks (same prompt length and seed: same chunks).
    """

    name: Literal["partial_kvzip"] = "partial_kvzip"  # type: ignore[assignment]
    chunk_size: int = Field(default=128, ge=1, strict=True)
    fraction: float | None = Field(default=0.25, gt=0.0, le=1.0, allow_inf_nan=False)
    num_chunks: int | None = Field(default=None, ge=1, strict=True)
    seed: int = Field(default=0, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _one_count(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("num_chunks") is not None:
            if data.get("fraction") is not None:
                raise ValueError("fraction and num_chunks are exclusive: give num_chunks and fraction=None")
            data = {**data, "fraction": None}
        return data

    @model_validator(mode="after")
    def _some_count(self) -> PartialKVzipConfig:
        if self.fraction is None and self.num_chunks is None:
            raise ValueError("give fraction (0 < fraction <= 1) or num_chunks (>= 1)")
        return self


@SAMPLERS.register(PartialKVzipConfig)
class PartialKVzipSampler(KVzipSampler):
    """KVzip's pseudo-future over K seeded chunks (1, sum_{i in drawn} T_i)."""

    config: PartialKVzipConfig  # type: ignore[assignment]

    def count(self, chunks: int) -> int:
        """K, the chunks reconstructed out of ``chunks`` (at least 1)."""
        cfg = self.config
        if cfg.num_chunks is not None:
            return min(cfg.num_chunks, chunks)
        assert cfg.fraction is not None
        return max(1, min(chunks, math.ceil(cfg.fraction * chunks - 1e-9)))

    def chunk_ranges(self, n: int) -> list[tuple[int, int]]:
        """K of KVzip's chunk ranges, drawn without replacement with ``seed``, in prompt order."""
        every = super().chunk_ranges(n)
        generator = torch.Generator().manual_seed(self.config.seed)
        drawn = torch.randperm(len(every), generator=generator)[: self.count(len(every))]
        return [every[i] for i in sorted(drawn.tolist())]
