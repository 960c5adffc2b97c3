"""Plain Monte Carlo mean over futures."""

from __future__ import annotations

from typing import Literal

import torch

from lorekv.aggregators.base import AGGREGATORS, Aggregator, AggregatorConfig, weight_dtype


class MeanConfig(AggregatorConfig):
    name: Literal["mean"] = "mean"


@AGGREGATORS.register(MeanConfig)
class MeanAggregator(Aggregator):
    """w_m = 1/M.

    The futures are samples from the model's own distribution over continuations, so the
    plain average U = (1/M) sum_m U_m is the unbiased Monte Carlo estimate of the expected
    score E_{future ~ model}[U(future)]. Log-probabilities and entropies are not used.
    """

    config: MeanConfig

    def compute_weights(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> torch.Tensor:
        """(M,) constant weights 1/M."""
        m = per_future.shape[0]
        return torch.full((m,), 1.0 / m, dtype=weight_dtype(per_future), device=per_future.device)
