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


class CompressedCache(PositionedCache):
    """A compressed prompt, ready to be continued: a transformers ``Cache`` holding only the kept
    prompt entries, at their original positions.

    It is what ``model.generate`` continues::

        compressed = pipeline.compress(model, input_ids)
        model.generate(input_ids, past_key_values=compressed, max_new_tokens=32, do_sample=True)

    with the same ``input_ids`` (or the compressed context followed by a question, query-agnostic
    mode), as transformers expects when a cache is passed. :meth:`get_seq_length` is the count
    of *positions* the cache covers (``next_position``), never the compressed length, so
    transformers feeds exactly the not-yet-cached suffix ``input_ids[:, next_position:]`` at
    positions ``next_position, next_position + 1, ...``: the pending prompt token goes through the
    compressed cache (the first answer token never comes from the full prefill) and the keys
    keep their RoPE. The model must have been through :func:`lorekv.hf.attention.prepare`
    (``Pipeline.compress`` does it), which installs the hooks that run each model call on this
    cache at those positions (:mod:`lorekv.hf.generation`).

    Like any cache passed to ``generate``, it is extended in place: a second ``generate`` on the
    same object is refused; :meth:`fork` first to answer several questions from one compression.

    Attributes:
        prompt_ids: (1, n) the prompt that was compressed (the context, query-agnostic).
        start: the position of the first pending prompt token (n - 1 query-aware, n otherwise):
            the tokens before it are in the cache.
        next_position: the position the next fed token takes (the original, uncompressed
            position, never the compressed length); ``start`` until the cache is extended.
        selection: the kept candidates per (evicted layer, KV head); None for a full cache.
        stats: see :class:`CompressionStats`; None for a full cache.
        damaged: a model call on the cache failed midway (some layers appended, others not);
            such a cache is refused.
    """

    def __init__(
        self,
        cache: PositionedCache,
        prompt_ids: torch.Tensor,
        start: int,
        selection: Selection | None = None,
        stats: CompressionStats | None = None,
    ) -> None:
        super().__init__([layer.window for layer in cache.layers])
        if not 0 <= start <= prompt_ids.shape[-1]:
            raise ValueError(f"start must lie in [0, {prompt_ids.shape[-1]}] (the prompt length), got {start}")
        self.layers = cache.layers
        self.prompt_ids = prompt_ids
        self.start = start
        self.next_position = start
        self.selection = selection
        self.stats = stats
        self.damaged = False

    @property
    def cache(self) -> CompressedCache:
        """The cache itself (kept for callers that read ``compressed.cache.layers``)."""
        return self

    @property
    def pending_ids(self) -> torch.Tensor:
        """(1, p) prompt tokens not yet fed: in query-aware mode the prompt's last token, which is
        re-fed through the compressed cache so that the first answer token is computed from the
        compressed cache and not from the full prefill; (1, 0) query-agnostic."""
        return self.prompt_ids[:, self.start :]

    @property
    def extended(self) -> int:
        """Tokens fed since compression (0 for a fresh cache or a fresh fork)."""
        return self.next_position - self.start

    def stored_past_next(self) -> bool:
        """Whether some layer holds an entry at ``next_position`` or later: tokens were fed
        around the position bookkeeping (``lorekv.hf.forward`` on this cache, a failed call),
        so continuing would feed those positions twice. One host read."""
        last = [layer.positions.amax() for layer in self.layers if layer.is_initialized and layer.positions.numel()]
        return bool(last) and int(torch.stack(last).max()) >= self.next_position

    def get_seq_length(self, layer_idx: int = 0) -> int:  # type: ignore[override]
        """The positions covered, ``next_position`` (what transformers derives positions from)."""
        return self.next_position

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:  # type: ignore[override]
        """The entries stored (not positions) plus ``query_length``: the key length attention sees."""
        return self.layers[layer_idx].get_seq_length() + query_length, 0

    @property
    def is_croppable(self) -> bool:  # type: ignore[override]
        """False: transformers' ``crop`` knows nothing of the slots' positions (see :meth:`crop`)."""
        return False

    def crop(self, tokens_to_remove: int) -> None:  # type: ignore[override]
        raise NotImplementedError("a compressed cache cannot be cropped (assisted decoding); fork it instead")

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:  # type: ignore[override]
        raise NotImplementedError("a compressed cache holds one sequence: beam search is not supported")

    def batch_repeat_interleave(self, repeats: int) -> None:  # type: ignore[override]
        raise NotImplementedError("a compressed cache holds one sequence (batch 1)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:  # type: ignore[override]
        raise NotImplementedError("a compressed cache holds one sequence (batch 1)")

    def fork(self) -> CompressedCache:
        """An independent continuation point sharing this one's tensors: ``generate`` (or any
        feed) on the fork leaves this one intact, so one compression answers several questions."""
        out = CompressedCache(self.copy(), self.prompt_ids, self.start, self.selection, self.stats)
        out.next_position = self.next_position
        out.damaged = self.damaged
        return out
