"""Importance scores and the kept-token selection that a policy derives from them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Scores:
    """Importance of every candidate prompt token, per evictable layer and KV head.

    Attributes:
        values: (L, G, n) non-negative scores; larger means more important to keep.
        layer_indices: the model layer index of each of the L rows.
        tail: prompt tokens after the n candidates that are kept outside the selection (1 in
            query-aware mode: the prompt's last token, re-fed through the compressed cache).
            They are the newest prompt tokens, so they count towards a policy's ``recent``.
    """

    values: torch.Tensor
    layer_indices: tuple[int, ...]
    tail: int = 0

    def __post_init__(self) -> None:
        if self.tail < 0:
            raise ValueError(f"tail must be >= 0, got {self.tail}")
        if self.values.dim() != 3:
            raise ValueError(f"scores must have shape (L, G, n), got {tuple(self.values.shape)}")
        if len(self.layer_indices) != self.values.shape[0]:
            raise ValueError(
                f"layer_indices has {len(self.layer_indices)} entries for {self.values.shape[0]} score rows"
            )

    @property
    def num_layers(self) -> int:
        return self.values.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.values.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.values.shape[2]


@dataclass(frozen=True)
class Selection:
    """Which candidate tokens each (layer, KV head) keeps.

    Attributes:
        indices: ``indices[l][g]`` is a sorted, duplicate-free (k_lg,) long tensor of token
            positions in ``[0, num_tokens)``.
        layer_indices: the model layer index of each entry of ``indices``.
        num_tokens: n, the number of candidates the selection was made from.
    """

    indices: tuple[tuple[torch.Tensor, ...], ...]
    layer_indices: tuple[int, ...]
    num_tokens: int

    @property
    def device(self) -> torch.device:
        """Where the indices live (the CPU for a selection without heads); derived tensors are built there."""
        for layer in self.indices:
            for head in layer:
                return head.device
        return torch.device("cpu")

    def counts(self) -> torch.Tensor:
        """(L, G) long on the CPU: kept tokens per layer and KV head (bookkeeping, read with ``tolist``)."""
        return torch.tensor([[len(head) for head in layer] for layer in self.indices], dtype=torch.long)

    def padded(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer`` as a rectangle padded to its longest head, on :attr:`device`.

        Returns:
            indices: (G, K) long, padding slots repeat the head's last kept index (or 0).
            valid: (G, K) bool, False on padding slots.
        """
        heads = self.indices[layer]
        k = max(len(h) for h in heads)
        idx = torch.zeros(len(heads), k, dtype=torch.long, device=self.device)
        valid = torch.zeros(len(heads), k, dtype=torch.bool, device=self.device)
        for g, head in enumerate(heads):
            head = head.to(idx.device)
            idx[g, : len(head)] = head
            if 0 < len(head) < k:
                idx[g, len(head) :] = head[-1]
            valid[g, : len(head)] = True
        return idx, valid

    def mask(self) -> torch.Tensor:
        """(L, G, n) bool on :attr:`device`: True where a token is kept.

        Built where the indices live: indexing a CPU mask with accelerator indices fails (and
        on the ``meta`` device silently writes nothing).
        """
        out = torch.zeros(
            len(self.indices), len(self.indices[0]), self.num_tokens, dtype=torch.bool, device=self.device
        )
        for layer, heads in enumerate(self.indices):
            for g, head in enumerate(heads):
                out[layer, g, head.to(out.device)] = True
        return out
