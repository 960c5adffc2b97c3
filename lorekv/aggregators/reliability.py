"""Futures weighted by how reliable they look: likely, confident and consensual."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import ValidationInfo, field_validator

from lorekv.aggregators.base import AGGREGATORS, Aggregator, AggregatorConfig, weight_dtype
from lorekv.validation import check_in_range

# Default floors on the spread of each signal across the futures, about the 10th percentile
# of the spreads measured on SmolLM2-135M-Instruct (see ReliabilityAggregator).
FLOOR_LP = 0.1
"""Default ``floor_lp``, nats per token."""
FLOOR_ENT = 0.02
"""Default ``floor_ent``, nats per token."""
FLOOR_DIS = 0.003
"""Default ``floor_dis``, rank-correlation units."""


class ReliabilityConfig(AggregatorConfig):
    """Attributes:
    a_lp: weight of the standardised mean token log-prob, in [0, inf).
    a_ent: weight of the standardised mean token entropy (penalised), in [0, inf).
    a_dis: weight of the standardised cross-future disagreement (penalised), in [0, inf).
    floor_lp: floor on the spread of the futures' mean token log-probs, in nats per token,
        in [0, inf): spreads below it count as this much, so a closer set of futures gets
        proportionally closer weights; 0 standardises by the spread alone.
    floor_ent: floor on the spread of the futures' mean token entropies, in nats per token,
        in [0, inf); 0 standardises by the spread alone.
    floor_dis: floor on the spread of the futures' disagreements, in units of the Spearman
        rank correlation, in [0, inf); 0 standardises by the spread alone.
    eps: added to the floored spread in the standardisation, in (0, inf): it keeps z finite
        (z = 0) when every future has the same value and the floor is 0; with a floor far
        above eps it changes nothing that matters.
    """

    name: Literal["reliability"] = "reliability"
    a_lp: float = 1.0
    a_ent: float = 1.0
    a_dis: float = 1.0
    floor_lp: float = FLOOR_LP
    floor_ent: float = FLOOR_ENT
    floor_dis: float = FLOOR_DIS
    eps: float = 1e-6

    @field_validator("a_lp", "a_ent", "a_dis", "floor_lp", "floor_ent", "floor_dis")
    @classmethod
    def _non_negative(cls, value: float, info: ValidationInfo) -> float:
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
    - z(x)_m = (x_m - mean(x)) / (max(std(x), f_x) + eps) standardises across the M futures
      (population std) with a floor f_x on the spread, in the signal's own unit
      (``floor_lp``, ``floor_ent``: nats per token; ``floor_dis``: rank-correlation units);
      with M = 1, z = 0.

    Why the floor. Standardising by the spread alone (the paper's z-score, f_x = 0) is
    scale-free: two futures 1e-5 nats/token apart get nearly the same z-scores (+-0.83, only
    eps tells them apart) as two futures 3 nats/token apart (+-1), so with M = 2 the weights
    depend only on the signs of the differences and a noise-size change can move a weight
    from 1/M to a fraction of it. With the floor, a spread at or above f_x is standardised
    exactly as before (the paper's scale-free weights), and a spread below it is measured
    against f_x instead: the futures' z-scores shrink in proportion to their differences and
    the weights move continuously towards uniform, reaching it when the futures are
    identical. The floor is the spread below which
    differences count as noise: z is Lipschitz in x with constant 1/f_x (each z_m moves by at
    most |dx|/f_x when one x_k moves by dx), so a change dlp in one future's mean log-prob
    moves no weight by more than a_lp * |dlp| / (2 f_lp), and one token's log-prob moves
    that mean by 1/T of its change.

    The default floors (0.1 and 0.02 nats per token, 0.003) are about the 10th percentile of
    each signal's spread across M = 4 futures of T = 8 tokens at temperature 1 (the paper's
    futures) on the bundled SmolLM2-135M-Instruct, measured by
    ``evaluations/reliability_spread.py`` on 64 needle prompts of ~1.5K tokens (the main
    grid's four task families, drawn with another seed than the evaluated prompts). The
    percentiles (5th, 10th, 25th, median) were 0.10, 0.13, 0.44, 1.0 for the log-prob, 0.007,
    0.016, 0.26, 0.79 for the entropy and 0.0024, 0.0031, 0.0037, 0.0087 for the
    disagreement. So on about nine sets in ten each signal is standardised exactly as in the
    paper; the floors bind where the futures (nearly) coincide in a signal, most often when
    three of the four sampled futures are the same text, and there a difference of a few
    hundredths of a nat in entropy no longer cancels a real difference in log-prob. A floor
    at the median spread instead would pull half of all sets towards the plain mean, a
    different estimator (the ``mean`` aggregator already is that). The spread of a mean over
    T tokens shrinks roughly as 1/sqrt(T): for much longer or shorter futures, or another
    model, measure it again (the script takes any of these as an argument or an edit).

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
        logits = cfg.a_lp * self._standardise(mean_logprob, cfg.floor_lp)
        logits = logits - cfg.a_ent * self._standardise(mean_entropy, cfg.floor_ent)
        if cfg.a_dis > 0:
            logits = logits - cfg.a_dis * self._standardise(self.disagreement(per_future), cfg.floor_dis)
        return torch.softmax(logits, dim=0).to(weight_dtype(per_future))

    @staticmethod
    def disagreement(per_future: torch.Tensor) -> torch.Tensor:
        """(M,) float64 dis_m = 1 - mean over (l, g) of rho(U_m[l, g], Ubar[l, g]); per_future (M, L, G, n)."""
        consensus = per_future.to(torch.float64).mean(dim=0, keepdim=True)
        rho = spearman(per_future, consensus)
        return 1.0 - rho.flatten(1).mean(dim=1)

    def _standardise(self, x: torch.Tensor, floor: float) -> torch.Tensor:
        """(M,) z(x) = (x - mean(x)) / (max(std(x), floor) + eps), population std.

        The floored spread is a tensor op (no host read), so the weights add no sync point.
        """
        centred = x - x.mean()
        spread = centred.pow(2).mean().sqrt()
        return centred / (spread.clamp_min(floor) + self.config.eps)
