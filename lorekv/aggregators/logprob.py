"""Futures weighted by their length-normalised log-probability."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import field_validator

from lorekv.aggregators.base import AGGREGATORS, Aggregator, AggregatorConfig, weight_dtype
from lorekv.validation import check_in_range


class LogprobConfig(AggregatorConfig):
    """Attributes:
    beta: inverse temperature on the mean token log-prob, in [0, inf); 0 gives the mean.
    """

    name: Literal["logprob"] = "logprob"
    beta: float = 1.0

    @field_validator("beta")
    @classmethod
    def _beta(cls, value: float) -> float:
        return check_in_range("beta", value, 0.0, math.inf, high_open=True)


@AGGREGATORS.register(LogprobConfig)
class LogprobAggregator(Aggregator):
    """w = softmax_m(beta * lp_m), lp_m = (1/T) sum_t logprobs[m, t].

    Favours the futures the model finds most likely. The log-prob is averaged over tokens
    (length-normalised) so that the weight does not depend on T. Like any weighting other
    than 1/M this is a biased estimate of the expectation under the model's sampling
    distribution (it moves towards the mode); beta = 0 recovers the plain mean.
    """

    config: LogprobConfig
    uses_token_stats = True

    def compute_weights(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> torch.Tensor:
        """(M,) softmax weights."""
        mean_logprob = logprobs.to(torch.float64).mean(dim=1)
        w = torch.softmax(self.config.beta * mean_logprob, dim=0)
        return w.to(device=per_future.device, dtype=weight_dtype(per_future))
