"""Aggregator interface: how are futures combined?

U = sum_m w_m U_m with w_m >= 0 and sum_m w_m = 1, where U_m (L, G, n) are the per-future
scores. Aggregators differ only in the weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from einops import einsum

from lorekv.registry import ComponentConfig, Registry


class AggregatorConfig(ComponentConfig):
    """Base config of every aggregator."""


def check_future_inputs(
    per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor, *, need_tokens: bool = False
) -> int:
    """Validate the aggregator inputs and return M, the number of futures.

    Args:
        per_future: (M, L, G, n) scores U_m, M >= 1.
        logprobs: (M, T) token log-probabilities.
        entropies: (M, T) next-token entropies, same shape as ``logprobs``.
        need_tokens: the caller averages ``logprobs``/``entropies`` over T, so T must be >= 1
            and the values finite.
    """
    if per_future.dim() != 4:
        raise ValueError(f"per_future must have shape (M, L, G, n), got {tuple(per_future.shape)}")
    m = per_future.shape[0]
    if m < 1:
        raise ValueError(f"per_future must hold M >= 1 futures, got M = {m}")
    if logprobs.dim() != 2 or logprobs.shape[0] != m:
        raise ValueError(f"logprobs must have shape (M={m}, T) to match per_future, got {tuple(logprobs.shape)}")
    if entropies.shape != logprobs.shape:
        raise ValueError(
            f"entropies must have the shape of logprobs {tuple(logprobs.shape)}, got {tuple(entropies.shape)}"
        )
    if need_tokens:
        if logprobs.shape[1] < 1:
            raise ValueError(f"logprobs must hold T >= 1 tokens per future, got T = {logprobs.shape[1]}")
        finite = torch.isfinite(logprobs).all(), torch.isfinite(entropies).all()
        if not bool(finite[0] & finite[1].to(finite[0].device)):  # one host read; the error names which
            raise ValueError("logprobs must be finite" if not bool(finite[0]) else "entropies must be finite")
    return m


def weight_dtype(per_future: torch.Tensor) -> torch.dtype:
    """Floating dtype the weights are computed and returned in: at least float32."""
    return torch.promote_types(per_future.dtype, torch.float32)


class Aggregator(ABC):
    """Weights over futures. Subclasses implement :meth:`compute_weights`; the base class
    validates the inputs once, in :meth:`weights` and :meth:`aggregate`.

    Attributes:
        uses_token_stats: the weights average ``logprobs``/``entropies`` over T, so the
            inputs must hold T >= 1 finite values per future.
    """

    config: AggregatorConfig
    uses_token_stats: ClassVar[bool] = False

    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config

    @abstractmethod
    def compute_weights(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> torch.Tensor:
        """(M,) weights from validated inputs (see :meth:`weights`)."""

    def weights(self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
        """(M,) non-negative weights summing to one, in at least float32.

        Args:
            per_future: (M, L, G, n) scores U_m.
            logprobs: (M, T) token log-probabilities of each future.
            entropies: (M, T) next-token entropies along each future.

        Raises:
            ValueError: on inconsistent shapes (see :func:`check_future_inputs`).
        """
        check_future_inputs(per_future, logprobs, entropies, need_tokens=self.uses_token_stats)
        return self.compute_weights(per_future, logprobs, entropies)

    def aggregate(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(U (L, G, n), w (M,)) with U = sum_m w_m U_m.

        The sum is taken in the weights' dtype (at least float32) and U is returned in the
        dtype of ``per_future``.
        """
        w = self.weights(per_future, logprobs, entropies)
        combined = einsum(w, per_future.to(w.dtype), "m, m l g n -> l g n")
        return combined.to(per_future.dtype), w


AGGREGATORS: Registry[Aggregator] = Registry("aggregator")
