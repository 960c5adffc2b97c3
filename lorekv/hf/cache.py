"""A transformers cache whose slots remember the position of the token they hold.

After eviction the cache is no longer a contiguous prefix of the sequence: slot i of head g
holds the token at position ``positions[b, g, i]`` (``-1`` marks padding, used when the
heads of one layer keep different numbers of tokens). Keys keep the RoPE of their original
positions; queries continue at the original positions; and the lorekv attention function
masks by position (causality, sliding windows, padding), so eviction never shifts anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, DynamicLayer

from lorekv.hf.context import active_pass
from lorekv.hf.introspection import layer_windows
from lorekv.scores import Selection

PADDING = -1


class PositionedLayer(DynamicLayer):
    """One layer's keys/values (B, G, K, d) with their token positions (B, G, K).

    ``window`` (sliding-window layers) bounds what is stored to the ``window - 1`` newest
    tokens, as the model's own sliding cache does (``slack`` more while a prefill needs them);
    such layers are never evicted.

    Appending concatenates, which copies the whole layer; :meth:`reserve` preallocates room
    so that appends (the futures' tokens, an answer) write in place, and once reserved room runs
    out it doubles, so an answer longer than the room reserved costs amortised O(1) per token.

    A layer with a ``prefix`` holds B branches continuing a shared layer of P rows (B/P branches
    per row): its own entries (B, G, S, d) are the branches' tokens only, and attention reads
    each prefix row once for its branches (:func:`lorekv.hf.attention.shared_prefix_attention`) instead of B copies.
    """

    def __init__(self, window: int | None = None, *, slack: int = 0) -> None:
        super().__init__()
        self.window = window
        self.slack = slack
        self.positions: torch.Tensor | None = None
        self.padded = False
        self.prefix: PositionedLayer | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def is_sliding(self) -> bool:  # type: ignore[override]
        return self.window is not None

    def set(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, *, padded: bool = False) -> None:
        """Replace the contents. ``padded``: some slots are padding (position -1)."""
        self.device = keys.device
        self.keys, self.values, self.positions = keys, values, positions
        self.padded = padded
        self.is_initialized = True
        self._buffers = None

    @property
    def reserved(self) -> bool:
        """Whether room was reserved for appends (:meth:`reserve`)."""
        return self._buffers is not None

    def reserve(self, batch: int, extra: int) -> None:
        """Hold ``batch`` rows (this layer broadcast to them) with room for ``extra`` more tokens."""
        if self.window is not None or not self.is_initialized:
            return
        _, g, k, d = self.keys.shape
        keys = self.keys.new_empty(batch, g, k + extra, d)
        values = self.values.new_empty(batch, g, k + extra, d)
        positions = self.positions.new_full((batch, g, k + extra), PADDING)
        keys[:, :, :k], values[:, :, :k], positions[:, :, :k] = self.keys, self.values, self.positions
        self.set(keys[:, :, :k], values[:, :, :k], positions[:, :, :k], padded=self.padded)
        self._buffers = (keys, values, positions)

    def append(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, *, padded: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add new tokens (B, G, q, d) at ``positions`` (B, q); return keys, values, positions the
        new queries may see. ``positions`` (q,) places every row alike; ``padded``: some of them
        may be padding (position -1)."""
        b, g, q, _ = keys.shape
        new_pos = positions.to(keys.device).view(-1, 1, q).expand(b, g, q)
        if padded and self.window is not None and self.is_initialized and q > 1:
            self.slack += q  # padding between stored and new tokens: keep every row's window - 1 newest real ones
        padded = padded or self.padded
        if self._buffers is not None and self._buffers[0].shape[0] == b and not self._fits(b, q):
            self.reserve(b, max(q, self.keys.shape[2]))  # reserved room ran out: double it
        if self._buffers is not None and self._fits(b, q):
            k_buf, v_buf, p_buf = self._buffers
            start, end = self.keys.shape[2], self.keys.shape[2] + q
            k_buf[:, :, start:end], v_buf[:, :, start:end], p_buf[:, :, start:end] = keys, values, new_pos
            self.keys, self.values, self.positions = k_buf[:, :, :end], v_buf[:, :, :end], p_buf[:, :, :end]
            self.padded = padded
            return self.keys, self.values, self.positions
        if not self.is_initialized:
            full = (keys, values, new_pos)
        else:
            full = (
                torch.cat([self.keys, keys], dim=-2),
                torch.cat([self.values, values], dim=-2),
                torch.cat([self.positions.expand(b, g, -1), new_pos], dim=-1),
            )
        keys_, values_, positions_ = full
        if self.window is not None and keys_.shape[-2] > self.window - 1 + self.slack:
            keep = self.window - 1 + self.slack
            keys_, values_, positions_ = keys_[..., -keep:, :], values_[..., -keep:, :], positions_[..., -keep:]
        self.set(keys_, values_, positions_, padded=padded)
        return full

    def _fits(self, batch: int, q: int) -> bool:
        buffer = self._buffers[0]
        return buffer.shape[0] == batch and self.keys.shape[2] + q <= buffer.shape[2]

    def get_seq_length(self) -> int:
        own = 0 if not self.is_initialized else self.keys.shape[-2]
        return own + (0 if self.prefix is None else self.prefix.get_seq_length())

    def trimmed(self, drop: int) -> PositionedLayer:
        """A layer sharing this one's tensors without its last ``drop`` slots (the ``window - 1``
        newest of the rest on a sliding layer): the cache as it stood ``drop`` tokens earlier, for
        a prefill's cache (slots in feeding order, every row ending with the same fed token)."""
        out = PositionedLayer(self.window)
        if self.is_initialized:
            end = max(0, self.keys.shape[2] - drop)
            start = 0 if self.window is None else max(0, end - (self.window - 1))
            out.set(
                self.keys[:, :, start:end],
                self.values[:, :, start:end],
                self.positions[:, :, start:end],
                padded=self.padded,
            )
        return out

    def row(self, index: int, length: int) -> PositionedLayer:
        """Row ``index`` as a batch-1 layer of its trailing ``length`` slots at most (a left-padded
        prefill's row of ``length`` real tokens: its padding left out); shares the tensors."""
        out = PositionedLayer(self.window)
        if self.is_initialized:
            start = self.keys.shape[2] - min(length, self.keys.shape[2])
            rows = slice(index, index + 1)
            out.set(self.keys[rows, :, start:], self.values[rows, :, start:], self.positions[rows, :, start:])
        return out

    def allocated_bytes(self) -> int:
        """Bytes of key/value storage held, reserved room included."""
        if not self.is_initialized:
            return 0
        keys, values = (self._buffers[0], self._buffers[1]) if self._buffers is not None else (self.keys, self.values)
        return keys.numel() * keys.element_size() + values.numel() * values.element_size()

    def kept_bytes(self) -> int:
        """Bytes of the real (non-padding) entries alone."""
        return _read_total([self.kept_bytes_lazy()])

    def held_bytes(self, extra: int) -> int:
        """Bytes of the real entries once ``extra`` more tokens are appended to every row and
        head (a sliding layer then holds at most its ``window - 1`` newest)."""
        return _read_total([self.held_bytes_lazy(extra)])

    def kept_bytes_lazy(self) -> int | torch.Tensor:
        """:meth:`kept_bytes` as an int when no slot is padding (counted from the shape), else as a
        0-d tensor on the layer's device, left unread so that a cache reads every layer's at once."""
        if not self.is_initialized:
            return 0
        if not self.padded:
            return self.positions.numel() * self._slot_bytes()
        return (self.positions != PADDING).sum() * self._slot_bytes()

    def held_bytes_lazy(self, extra: int) -> int | torch.Tensor:
        """:meth:`held_bytes` as :meth:`kept_bytes_lazy` gives :meth:`kept_bytes`."""
        if not self.is_initialized:
            return 0
        cap = None if self.window is None else self.window - 1
        if not self.padded:
            b, g, k = self.positions.shape
            return b * g * (k + extra if cap is None else min(k + extra, cap)) * self._slot_bytes()
        held = (self.positions != PADDING).sum(-1) + extra
        if cap is not None:
            held = held.clamp(max=cap)
        return held.sum() * self._slot_bytes()

    def _slot_bytes(self) -> int:
        return self.keys.shape[-1] * (self.keys.element_size() + self.values.element_size())


class PositionedCache(Cache):
    """A cache of :class:`PositionedLayer`; feed it with :func:`lorekv.hf.attention.forward`,
    which publishes the positions of the tokens in flight (:mod:`lorekv.hf.context`)."""

    def __init__(self, windows: Sequence[int | None], *, slack: int = 0) -> None:
        super().__init__(layers=[PositionedLayer(w, slack=slack) for w in windows])

    @classmethod
    def for_model(cls, config: PretrainedConfig, *, slack: int = 0) -> PositionedCache:
        """Sliding-window layers bounded as the model's config says (``window - 1 + slack``
        tokens), other layers full."""
        return cls(layer_windows(config), slack=slack)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):  # type: ignore[override]
        current = active_pass()
        if current is None or current.cache is not self:
            raise RuntimeError(
                "PositionedCache must be fed through lorekv.hf.attention.forward, or (a CompressedCache) "
                "by a model prepared with lorekv.hf.prepare(model), which Pipeline.compress does"
            )
        keys, values, positions = self.layers[layer_idx].append(
            key_states, value_states, current.query_positions, padded=current.padded
        )
        current.key_positions[layer_idx] = positions
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:  # type: ignore[override]
        return self.layers[layer_idx].get_seq_length()

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:  # type: ignore[override]
        return self.get_seq_length(layer_idx) + query_length, 0

    @property
    def is_sliding(self) -> list[bool]:  # type: ignore[override]
        return [layer.is_sliding for layer in self.layers]

    def reserve(self, batch: int, extra: int) -> None:
        """Room for ``extra`` more tokens in ``batch`` rows in every full-attention layer."""
        for layer in self.layers:
            layer.reserve(batch, extra)

    def copy(self) -> PositionedCache:
        """A cache sharing this one's tensors; appending to either leaves the other unchanged."""
        out = PositionedCache([layer.window for layer in self.layers])
        for src, dst in zip(self.layers, out.layers, strict=True):
            if src.is_initialized:
                dst.set(src.keys, src.values, src.positions, padded=src.padded)
            dst.prefix, dst.slack = src.prefix, src.slack
        return out

    def trimmed(self, drop: int) -> PositionedCache:
        """The cache as it stood ``drop`` fed tokens earlier (a prefill's cache; shares its tensors).

        Sliding layers must hold the token ``window - 1`` before that point: a cache prefilled
        with ``slack=1`` does for ``drop=1``, which is how one prefill pass yields both the
        n-token cache and the (n-1)-token one query-aware eviction needs.
        """
        out = PositionedCache([layer.window for layer in self.layers])
        out.layers = [layer.trimmed(drop) for layer in self.layers]
        return out

    def row(self, index: int, length: int) -> PositionedCache:
        """Row ``index`` of a left-padded prefill's cache as a batch-1 cache of its ``length`` real
        tokens (the trailing slots of every layer); shares the tensors."""
        out = PositionedCache([layer.window for layer in self.layers])
        out.layers = [layer.row(index, length) for layer in self.layers]
        return out

    @classmethod
    def stack(cls, caches: Sequence[PositionedCache]) -> PositionedCache:
        """One cache of B rows from B batch-1 caches (one per row, each ragged across heads).

        Every layer is left-padded to its longest row (position -1, masked by lorekv's attention):
        slots keep their feeding order, so a sliding layer's newest entries stay last in every row.
        """
        if not caches:
            raise ValueError("stack needs at least one cache")
        out = cls([layer.window for layer in caches[0].layers])
        for idx, dst in enumerate(out.layers):
            rows = [cache.layers[idx] for cache in caches]
            if not all(row.is_initialized for row in rows):
                continue
            width = max(row.keys.shape[2] for row in rows)
            pads = [width - row.keys.shape[2] for row in rows]
            if len(rows) == 1:
                dst.set(rows[0].keys, rows[0].values, rows[0].positions, padded=rows[0].padded)
                continue
            dst.set(
                torch.cat([F.pad(row.keys, (0, 0, pad, 0)) for row, pad in zip(rows, pads, strict=True)]),
                torch.cat([F.pad(row.values, (0, 0, pad, 0)) for row, pad in zip(rows, pads, strict=True)]),
                torch.cat([F.pad(row.positions, (pad, 0), value=PADDING) for row, pad in zip(rows, pads, strict=True)]),
                padded=any(pads) or any(row.padded for row in rows),
            )
        return out

    def branches(self, per_row: int) -> PositionedCache:
        """A cache of ``per_row`` continuations of each of this cache's P rows (P * per_row rows,
        row p's continuations first), which read this one as a read-only prefix: nothing is
        copied, each layer starts with no entries of its own."""
        out = PositionedCache([layer.window for layer in self.layers])
        for src, dst in zip(self.layers, out.layers, strict=True):
            if not src.is_initialized:
                continue
            prefix = PositionedLayer(src.window)
            prefix.set(src.keys, src.values, src.positions, padded=src.padded)
            p, g, _, d = src.keys.shape
            dst.set(
                src.keys.new_empty(p * per_row, g, 0, d),
                src.values.new_empty(p * per_row, g, 0, d),
                src.positions.new_empty(p * per_row, g, 0),
            )
            dst.prefix = prefix
        return out

    def allocated_bytes(self) -> int:
        return sum(layer.allocated_bytes() for layer in self.layers)

    def kept_bytes(self) -> int:
        """Bytes of the real entries of every layer (one host read at most, whatever the layer count)."""
        return _read_total([layer.kept_bytes_lazy() for layer in self.layers])

    def held_bytes(self, extra: int) -> int:
        """:meth:`PositionedLayer.held_bytes` summed over the layers, read as :meth:`kept_bytes`."""
        return _read_total([layer.held_bytes_lazy(extra) for layer in self.layers])


def _read_total(parts: Sequence[int | torch.Tensor]) -> int:
    """The sum of ints and 0-d tensors: the tensors of each device summed there and read once."""
    total = sum(part for part in parts if isinstance(part, int))
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for part in parts:
        if isinstance(part, torch.Tensor):
            by_device.setdefault(part.device, []).append(part)
    return total + sum(int(torch.stack(tensors).sum()) for tensors in by_device.values())


def gather(source: PositionedCache, selection: Selection) -> PositionedCache:
    """A new cache with the selected entries of evicted layers and the other layers' entries as
    they are (sharing their tensors).

    Heads of one layer that keep different counts are padded to the longest (position -1,
    masked by the lorekv attention function). Nothing is read on the host.
    """
    out = PositionedCache([layer.window for layer in source.layers])
    row = {layer_idx: i for i, layer_idx in enumerate(selection.layer_indices)}
    for idx, (src, dst) in enumerate(zip(source.layers, out.layers, strict=True)):
        if idx in row:
            kept, valid = selection.padded(row[idx])
            ragged = len({len(head) for head in selection.indices[row[idx]]}) > 1
            kept = kept.to(src.keys.device)
            valid = valid.to(src.keys.device)
            index = kept.view(1, *kept.shape, 1).expand(1, -1, -1, src.keys.shape[-1])
            positions = torch.where(valid, src.positions[0].gather(1, kept), torch.full_like(kept, PADDING))
            dst.set(
                src.keys.gather(2, index),
                src.values.gather(2, index),
                positions.unsqueeze(0),
                padded=ragged,
            )
        elif src.is_initialized:
            dst.set(src.keys, src.values, src.positions, padded=src.padded)
    return out
