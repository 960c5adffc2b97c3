"""Strided reconstruction: KVzip's repeat-the-context future, replaying the start of every chunk.

KVzip ("KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
https://arxiv.org/abs/2505.23416; :mod:`lorekv.samplers.kvzip`) teacher-forces the whole
context a second time after a "repeat" instruction, so its compression costs a second pass
over the context on top of the prefill. This sampler splits the context into chunks of
``chunk_size`` tokens as KVzip does, but replays only the first ``replay`` tokens of each: the
repeat inputs hold about replay / chunk_size of the context (plus one instruction per chunk).
The cost falls by less than that factor: every replayed query still meets the whole prompt's
cache and its chunk's keys.

What it estimates: every replayed query's softmax covers the sinks and its *whole* chunk (the
replayed part and the rest), as KVzip's chunked softmax, so every token of the context is scored
by the queries of its own chunk: a probe of each chunk, where :mod:`~lorekv.samplers.partial_kvzip`
replays whole chunks drawn at random and leaves the others unscored. A token outside the replayed
part is scored by the attention the replay pays it while copying its neighbours, not by the
query that copies it. With ``replay >= chunk_size`` it is KVzip with that chunk size.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lorekv.samplers.base import SAMPLERS
from lorekv.samplers.kvzip import KVzipConfig, KVzipSampler


class StridedKVzipConfig(KVzipConfig):
    """Config of :class:`StridedKVzipSampler`: :class:`~lorekv.samplers.kvzip.KVzipConfig`'s
    fields, a smaller default ``chunk_size``, and how much of each chunk is replayed.

    Attributes:
        chunk_size: tokens per chunk, the span each replayed query's softmax covers (>= 1; 128 by
            default, so that a context of a few thousand tokens has many probes: KVzip's 2048
            gives one).
        replay: the first tokens of each chunk that are replayed (>= 1; default 32, a quarter of
            the default chunk). A later chunk's replay is introduced, as KVzip's, by the
            continuation and the ``overlap`` tokens before the chunk.
    """

    name: Literal["strided_kvzip"] = "strided_kvzip"  # type: ignore[assignment]
    chunk_size: int = Field(default=128, ge=1, strict=True)
    replay: int = Field(default=32, ge=1, strict=True)


@SAMPLERS.register(StridedKVzipConfig)
class StridedKVzipSampler(KVzipSampler):
    """KVzip's pseudo-future replaying the first ``replay`` tokens of every chunk
    (1, sum_i min(replay, chunk_i) + instructions), each query seeing its whole chunk."""

    config: StridedKVzipConfig  # type: ignore[assignment]

    def replay_end(self, start: int, end: int) -> int:
        """The chunk's first ``replay`` tokens (all of a shorter last chunk)."""
        return min(start + self.config.replay, end)
