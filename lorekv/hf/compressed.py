"""The result of compression: a cache holding only the kept prompt entries, and its stats."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lorekv.hf.cache import PositionedCache
from lorekv.scores import Selection


@dataclass(frozen=True)
class CompressionStats:
    """What compression kept, what it cost in memory, and how long each phase took.

    Attributes:
        prompt_tokens: n, the prompt length.
        candidate_tokens: how many prompt tokens were eviction candidates (n - 1 when the
            last prompt token is re-fed through the compressed cache, else n).
        layer_indices: the evicted (full-attention) layers.
        kept: ``kept[l][g]``, candidates kept by evicted layer l, KV head g (the budget counts these).
        bytes_before: bytes of the prompt's KV cache, every layer, before eviction.
        bytes_after: bytes actually allocated after eviction (padding of ragged heads included).
        bytes_kept: bytes of the kept entries alone (no padding).
        pending_tokens: prompt tokens fed through the compressed cache before the answer (the
            re-fed last prompt token query-aware: 1; query-agnostic: 0). They are not candidates
            and not budgeted, but the cache holds them: see :attr:`held` and ``bytes_held``.
        bytes_held: bytes of the real entries (every layer, no padding) once the pending tokens
            are fed: what the cache holds when the answer starts, to compare with a library
            that counts the whole cache.
        seconds: wall-clock seconds of each phase: prefill, sampling, scoring, selection.
        future_weights: w_m, the aggregator's weight of each future (sums to one).
    """

    prompt_tokens: int
    candidate_tokens: int
    layer_indices: tuple[int, ...]
    kept: tuple[tuple[int, ...], ...]
    bytes_before: int
    bytes_after: int
    bytes_kept: int
    pending_tokens: int
    bytes_held: int
    seconds: dict[str, float] = field(default_factory=dict)
    future_weights: tuple[float, ...] = ()

    @property
    def kept_fraction(self) -> float:
        """Mean kept candidates per evicted (layer, head) over the candidate count."""
        counts = torch.tensor(self.kept, dtype=torch.float64)
        return float(counts.mean()) / self.candidate_tokens

    @property
    def held(self) -> tuple[tuple[int, ...], ...]:
        """``held[l][g]``: entries evicted layer l, KV head g holds when the answer starts (kept + pending)."""
        return tuple(tuple(k + self.pending_tokens for k in row) for row in self.kept)

    @property
    def held_fraction(self) -> float:
        """Mean entries held per evicted (layer, head) over the prompt length n."""
        counts = torch.tensor(self.held, dtype=torch.float64)
        return float(counts.mean()) / self.prompt_tokens

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "candidate_tokens": self.candidate_tokens,
            "layer_indices": list(self.layer_indices),
            "kept": [list(k) for k in self.kept],
            "kept_fraction": self.kept_fraction,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "bytes_kept": self.bytes_kept,
            "pending_tokens": self.pending_tokens,
            "held": [list(h) for h in self.held],
            "held_fraction": self.held_fraction,
            "bytes_held": self.bytes_held,
            "seconds": dict(self.seconds),
            "future_weights": list(self.future_weights),
        }


@dataclass
class CompressedCache:
    """A compressed prompt, ready to be continued.

    Attributes:
        cache: the kept prompt entries, at their original positions.
        next_position: the position the next fed token takes (the original, uncompressed
            position, never the compressed length).
        pending_ids: (1, p) prompt tokens not yet fed: in query-aware mode the prompt's last
            token, which is re-fed through the compressed cache so that the first answer
            token is computed from the compressed cache and not from the full prefill.
        selection: the kept candidates per (evicted layer, KV head).
        stats: see :class:`CompressionStats`.
    """

    cache: PositionedCache
    next_position: int
    pending_ids: torch.Tensor
    selection: Selection
    stats: CompressionStats

    def fork(self) -> CompressedCache:
        """An independent continuation point: decoding from the fork leaves this one intact."""
        return CompressedCache(self.cache.copy(), self.next_position, self.pending_ids, self.selection, self.stats)
