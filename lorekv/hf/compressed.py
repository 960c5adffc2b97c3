"""The result of compression: a cache holding only the kept prompt entries, and its stats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lorekv.hf.cache import PositionedCache
from lorekv.scores import Selection

if TYPE_CHECKING:
    from lorekv.hf.bounded import Bound


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
        seconds: wall-clock seconds of each phase: prefill, sampling, scoring, selection (of
            the whole batch, for a prompt compressed in a batch).
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
    """A compressed prompt, or a batch of them, ready to be continued: a transformers ``Cache``
    holding only the kept prompt entries, at their original positions.

    It is what ``model.generate`` continues::

        compressed = pipeline.compress(model, input_ids)
        model.generate(input_ids, cache=compressed, max_new_tokens=32, do_sample=True)

    with the same ``input_ids`` (or the compressed context followed by a question, query-agnostic
    mode), as transformers expects when a cache is passed. A batch is left-padded, as
    transformers generates: ``pipeline.compress(model, input_ids, attention_mask=mask)`` and
    ``model.generate(input_ids, attention_mask=mask, cache=compressed)``; row i keeps
    its own positions 0..n_i-1 whatever its padding, and its answer continues at n_i.

    :meth:`get_seq_length` is the count of *columns* of ``input_ids`` the cache covers
    (``next_position``; for one unpadded row, the positions covered), never the compressed
    length, so transformers feeds exactly the not-yet-cached suffix ``input_ids[:, next_position:]``:
    the pending prompt token goes through the compressed cache (the first answer token never
    comes from the full prefill) and the keys keep their RoPE. The model must have been through
    :func:`lorekv.hf.attention.prepare` (``Pipeline.compress`` does it), which installs the hooks
    that run each model call on this cache at each row's positions (:mod:`lorekv.hf.generation`).

    Like any cache passed to ``generate``, it is extended in place: a second ``generate`` on the
    same object is refused; :meth:`fork` first to answer several questions from one compression,
    and :meth:`rows` to ask some rows only.

    Attributes:
        prompt_ids: (b, N) the prompts that were compressed (the contexts, query-agnostic),
            left-padded.
        attention_mask: (b, N) long, 1 for a real token and 0 for padding.
        lengths: n_i, the real token count of each row.
        start: the column of the first pending prompt token (N - 1 query-aware, N otherwise):
            the columns before it are in the cache.
        next_position: the column the next fed token takes (the original, uncompressed
            position for one unpadded row, never the compressed length); ``start`` until the
            cache is extended.
        row_positions: (b,) long, the position the next real token of each row takes.
        selections: each row's kept candidates per (evicted layer, KV head); empty for a full cache.
        row_stats: each row's :class:`CompressionStats`; empty for a full cache.
        method: the pipeline config that compressed it, in its JSON form (``PipelineConfig``'s
            ``model_dump(mode="json")`` for the mode it compressed in), when known: saved with the
            cache (:func:`lorekv.hf.storage.save_compressed`); None otherwise. A compression is
            saved to a file and loaded back by :func:`~lorekv.hf.storage.save_compressed` and
            :func:`~lorekv.hf.storage.load_compressed`.
        damaged: a model call on the cache failed midway (some layers appended, others not);
            such a cache is refused.
        positions_checked: a ``generate`` call is continuing the cache with position ids it
            derives from an attention mask already checked (:func:`lorekv.hf.generation.checked_generate`),
            so its steps need no comparison of them with the cache's own.
        bound: the decoding schedule that keeps the cache within its budget while it is
            continued (:class:`lorekv.hf.bounded.Bound`, attached by
            :meth:`lorekv.schedule.DecodingSchedule.attach`); None: the cache grows with every
            token fed.
    """

    def __init__(
        self,
        cache: PositionedCache,
        prompt_ids: torch.Tensor,
        start: int,
        selections: Sequence[Selection] = (),
        row_stats: Sequence[CompressionStats] = (),
        *,
        attention_mask: torch.Tensor | None = None,
        method: dict | None = None,
    ) -> None:
        super().__init__([layer.window for layer in cache.layers])
        b, width = prompt_ids.shape
        if not 0 <= start <= width:
            raise ValueError(f"start must lie in [0, {width}] (the prompt length), got {start}")
        if attention_mask is None:
            attention_mask = torch.ones_like(prompt_ids)
        if tuple(attention_mask.shape) != (b, width):
            raise ValueError(f"attention_mask must have shape ({b}, {width}), got {tuple(attention_mask.shape)}")
        if len(selections) not in (0, b) or len(row_stats) not in (0, b):
            raise ValueError(f"selections and row_stats need one entry per row ({b}), or none")
        self.layers = cache.layers
        self.prompt_ids = prompt_ids
        self.attention_mask = attention_mask.long()
        self.lengths = tuple(int(n) for n in self.attention_mask.sum(1).tolist())
        self.start = start
        self.next_position = start
        self.row_positions = self.attention_mask[:, :start].sum(1)
        self.selections = tuple(selections)
        self.row_stats = tuple(row_stats)
        self.method = method
        self.damaged = False
        self.positions_checked = False
        self.bound: Bound | None = None

    @property
    def batch_size(self) -> int:
        """b, the rows (prompts) the cache holds."""
        return self.prompt_ids.shape[0]

    @property
    def selection(self) -> Selection | None:
        """The kept candidates of a one-row cache (None: a full cache); see :attr:`selections`."""
        return self._only(self.selections, "selection", "selections")

    @property
    def stats(self) -> CompressionStats | None:
        """The compression stats of a one-row cache (None: a full cache); see :attr:`row_stats`."""
        return self._only(self.row_stats, "stats", "row_stats")

    def _only(self, per_row: tuple, name: str, plural: str) -> object:
        if self.batch_size != 1:
            raise ValueError(f"a cache of {self.batch_size} rows has one {name} per row: read {plural}[i]")
        return per_row[0] if per_row else None

    @property
    def cache(self) -> CompressedCache:
        """The cache itself (kept for callers that read ``compressed.cache.layers``)."""
        return self

    @property
    def pending_ids(self) -> torch.Tensor:
        """(b, p) prompt tokens not yet fed: in query-aware mode each prompt's last token, which is
        re-fed through the compressed cache so that the first answer token is computed from the
        compressed cache and not from the full prefill; (b, 0) query-agnostic."""
        return self.prompt_ids[:, self.start :]

    @property
    def extended(self) -> int:
        """Columns fed since compression (0 for a fresh cache or a fresh fork)."""
        return self.next_position - self.start

    def stored_past_next(self) -> bool:
        """Whether some layer holds an entry at a row's next position or later: tokens were fed
        around the position bookkeeping (``lorekv.hf.forward`` on this cache, a failed call),
        so continuing would feed those positions twice. One host read."""
        last = [
            layer.positions.amax(dim=(1, 2))
            for layer in self.layers
            if layer.is_initialized and layer.positions.numel()
        ]
        if not last:
            return False
        return bool((torch.stack(last).amax(0) >= self.row_positions.to(last[0].device)).any())

    def get_seq_length(self, layer_idx: int = 0) -> int:  # type: ignore[override]
        """The columns covered, ``next_position`` (what transformers derives the fed suffix from)."""
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
        raise NotImplementedError("a compressed cache continues its rows as they are: beam search is not supported")

    def batch_repeat_interleave(self, repeats: int) -> None:  # type: ignore[override]
        raise NotImplementedError("a compressed cache continues its rows as they are (one sequence each)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:  # type: ignore[override]
        raise NotImplementedError("a compressed cache is not reshaped in place: take compressed.rows(indices)")

    def fork(self) -> CompressedCache:
        """An independent continuation point sharing this one's tensors: ``generate`` (or any
        feed) on the fork leaves this one intact, so one compression answers several questions."""
        out = CompressedCache(
            self.copy(),
            self.prompt_ids,
            self.start,
            self.selections,
            self.row_stats,
            attention_mask=self.attention_mask,
            method=self.method,
        )
        out.next_position = self.next_position
        out.row_positions = self.row_positions.clone()
        out.damaged = self.damaged
        out.bound = None if self.bound is None else self.bound.copy()
        return out

    def rows(self, indices: Sequence[int]) -> CompressedCache:
        """A fork holding the rows ``indices`` only, in that order (a copy of their entries): the
        rows that have a question in a round where the others have none (query-agnostic)."""
        indices = list(indices)
        if not indices or not all(isinstance(i, int) and 0 <= i < self.batch_size for i in indices):
            raise ValueError(f"indices must be a non-empty list of rows in [0, {self.batch_size}), got {indices}")
        picked = PositionedCache([layer.window for layer in self.layers])
        for src, dst in zip(self.layers, picked.layers, strict=True):
            if src.is_initialized:
                index = torch.tensor(indices, device=src.keys.device)
                dst.set(src.keys[index], src.values[index], src.positions[index], padded=src.padded)
                dst.slack = src.slack
        out = CompressedCache(
            picked,
            self.prompt_ids[indices],
            self.start,
            [self.selections[i] for i in indices] if self.selections else (),
            [self.row_stats[i] for i in indices] if self.row_stats else (),
            attention_mask=self.attention_mask[indices],
            method=self.method,
        )
        out.next_position = self.next_position
        out.row_positions = self.row_positions[indices].clone()
        out.damaged = self.damaged
        out.bound = None if self.bound is None else self.bound.rows(indices)
        return out
