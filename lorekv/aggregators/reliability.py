"""Futures weighted by how reliable they look: likely, confident and consensual."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import ValidationInfo, field_validator

from lorekv.aggregators.base import AGGREGATORS, Aggregator, AggregatorConfig, weight_dtype
from lorekv.validation import check_in_range


class ReliabilityConfig(AggregatorConfig):
    """Attributes:
    a_lp: weight of the standardised mean token log-prob, in [0, inf).
    a_ent: weight of the standardised mean token entropy (penalised), in [0, inf).
    a_dis: weight of the standardised cross-future disagreement (penalised), in [0, inf).
    eps: added to the standard deviation in the standardisation, in (0, inf).
    """

    name: Literal["reliability"] = "reliability"
    a_lp: float = 1.0
    a_ent: float = 1.0
    a_dis: float = 1.0
    eps: float = 1e-6

    @field_validator("a_lp", "a_ent", "a_dis")
    @classmethod
    def _coefficient(cls, value: float, info: ValidationInfo) -> float:
        return check_in_range(info.field_name, value, 0.0, math.inf, high_open=True)

    @field_validator("eps")
    @classmethod
    def _eps(cls, value: float) -> float:
        return check_in_range("eps", value, 0.0, math.inf, low_open=True, high_open=True)


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """(..., n) 1-based ranks along the last dimension; tied values share their mean rank.

    rank_j = (#{i: x_i < x_j} + #{i: x_i <= x_j} + 1) / 2, in float64. Ranks depend only
    on the values, never on the order ties happen to be stored in.
    """
    ordered = torch.sort(x, dim=-1).values.contiguous()
    x = x.contiguous()
    below = torch.searchsorted(ordered, x, side="left")
    at_or_below = torch.searchsorted(ordered, x, side="right")
    return (below + at_or_below + 1).to(torch.float64) / 2


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation of x and y along the last dimension.

    x and y are (..., n) and broadcast against each other in the leading dimensions.

    rho = sum_j r_j s_j / sqrt(sum_j r_j^2 * sum_j s_j^2) with r, s the average ranks of x
    and y centred by (n + 1) / 2 (their exact mean). A constant vector (including n = 1)
    has no ranking: two constant vectors agree (rho = 1); a constant and a non-constant one
    are uncorrelated (rho = 0). So rho is never NaN.
    """
    n = x.shape[-1]
    r = average_ranks(x) - (n + 1) / 2
    s = average_ranks(y) - (n + 1) / 2
    rr, ss = (r * r).sum(-1), (s * s).sum(-1)
    rho = (r * s).sum(-1) / torch.sqrt(rr * ss).clamp_min(torch.finfo(torch.float64).tiny)
    flat_x, flat_y = rr == 0, ss == 0
    rho = torch.where(flat_x | flat_y, torch.zeros_like(rho), rho)
    return torch.where(flat_x & flat_y, torch.ones_like(rho), rho)


@AGGREGATORS.register(ReliabilityConfig)
class ReliabilityAggregator(Aggregator):
    """Reliability-weighted futures.

    w = softmax_m( a_lp * z(lp)_m - a_ent * z(ent)_m - a_dis * z(dis)_m ), where, for future m:

    - lp_m = (1/T) sum_t logprobs[m, t], its mean token log-prob (how likely it is);
    - ent_m = (1/T) sum_t entropies[m, t], its mean next-token entropy (how unsure the
      model was while producing it);
    - dis_m = 1 - (1/(L G)) sum_{l, g} rho(U_m[l, g, :], Ubar[l, g, :]), its disagreement
      with the ensemble: rho is the Spearman rank correlation (average ranks for ties; for
      constant vectors see :func:`spearman`) and Ubar = (1/M) sum_m U_m the plain mean;
      dis_m is in [0, 2];
    - z(x)_m = (x_m - mean(x)) / (std(x) + eps) standardises across the M futures
      (population std), so the three signals are on one scale; with M = 1, z = 0.

    This changes what is estimated. The plain mean (:class:`~lorekv.aggregators.mean.
    MeanAggregator`) is the Monte Carlo estimate of the expected score under the model's own
    sampling distribution; reliability weighting is a reweighted, biased estimate that
    favours confident, consensual futures over unlikely or idiosyncratic ones. With all
    three coefficients 0 it is the plain mean. All statistics are symmetric in the futures,
    so permuting the futures permutes the weights and leaves U unchanged.
    """

    config: ReliabilityConfig
    uses_token_stats = True

    def compute_weights(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> torch.Tensor:
        """(M,) softmax weights."""
        cfg = self.config
        device = per_future.device
        mean_logprob = logprobs.to(device=device, dtype=torch.float64).mean(dim=1)
        mean_entropy = entropies.to(device=device, dtype=torch.float64).mean(dim=1)
        logits = cfg.a_lp * self._standardise(mean_logprob) - cfg.a_ent * self._standardise(mean_entropy)
        if cfg.a_dis > 0:
            logits = logits - cfg.a_dis * self._standardise(self.disagreement(per_future))
        return torch.softmax(logits, dim=0).to(weight_dtype(per_future))

    @staticmethod
    def disagreement(per_future: torch.Tensor) -> torch.Tensor:
        """(M,) float64 dis_m = 1 - mean over (l, g) of rho(U_m[l, g], Ubar[l, g]); per_future (M, L, G, n)."""
        consensus = per_future.to(torch.float64).mean(dim=0, keepdim=True)
        rho = spearman(per_future, consensus)
        return 1.0 - rho.flatten(1).mean(dim=1)

    def _standardise(self, x: torch.Tensor) -> torch.Tensor:
        """(M,) z(x) = (x - mean(x)) / (std(x) + eps), population std."""
        centred = x - x.mean()
        return centred / (centred.pow(2).mean().sqrt() + self.config.eps)
