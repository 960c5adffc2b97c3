"""Aggregator interface: how are futures combined?

U = sum_m w_m U_m with w_m >= 0 and sum_m w_m = 1, where U_m (L, G, n) are the per-future
scores. Aggregators differ only in the weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from lorekv.registry import ComponentConfig, Registry


class AggregatorConfig(ComponentConfig):
    """Base config of every aggregator."""


class Aggregator(ABC):
    config: AggregatorConfig

    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config

    @abstractmethod
    def weights(self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
        """(M,) non-negative weights summing to one.

        Args:
            per_future: (M, L, G, n) scores U_m.
            logprobs: (M, T) token log-probabilities of each future.
            entropies: (M, T) next-token entropies along each future.
        """

    def aggregate(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(U (L, G, n), w (M,)) with U = sum_m w_m U_m."""
        raise NotImplementedError


AGGREGATORS: Registry[Aggregator] = Registry("aggregator")
