"""Intervals for accuracies and paired comparisons of methods.

Accuracy is reported with its sample count and a 95% interval:

- scores that are all 0 or 1 (exact-match metrics) get the Wilson score interval, which keeps
  its coverage near 95% for small n and proportions near 0 or 1, where the normal (Wald)
  interval collapses (Brown, Cai & DasGupta 2001, "Interval Estimation for a Binomial
  Proportion", Statistical Science 16(2));
- fractional scores (partial-match metrics) get a seeded percentile bootstrap of the mean
  (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13).

Every method sees the same samples, so methods are compared by *paired* differences: the
bootstrap resamples samples (pairs), not the two methods independently, which removes the
between-sample variance that both methods share. A difference whose interval covers 0 is not a
finding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lorekv.validation import check_int_at_least

Z95 = 1.96
"""The standard normal quantile of 0.975 (1.95996...) as textbooks round it: a two-sided 95% interval."""

_CHUNK_CELLS = 2_000_000
"""Most resample entries drawn at once, so memory stays bounded for large n."""


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for ``successes`` out of ``n`` trials.

    With p = successes / n: ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)``
    (Wilson 1927, JASA 22(158)). It is the set of proportions that a score test at level
    ``z`` does not reject, so it lies in [0, 1] and is never empty, even at 0/n or n/n.
    """
    check_int_at_least("n", n, 1)
    check_int_at_least("successes", successes, 0)
    if successes > n:
        raise ValueError(f"successes must be <= n ({n}), got {successes}")
    if not (isinstance(z, (int, float)) and z > 0 and math.isfinite(z)):
        raise ValueError(f"z must be a finite number > 0, got {z!r}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # Clamp the rounding error at 0/n and n/n, where the exact bounds are 0 and 1.
    return max(0.0, center - half), min(1.0, center + half)


def _scores_array(name: str, scores: Sequence[float]) -> np.ndarray:
    """``scores`` as a 1-d float64 array of values in [0, 1], at least one."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of scores, got shape {x.shape}")
    if not np.all((x >= 0) & (x <= 1)):
        raise ValueError(f"{name} must lie in [0, 1], got values {x[~((x >= 0) & (x <= 1))][:5].tolist()}")
    return x


def _is_binary(x: np.ndarray) -> bool:
    return bool(np.all((x == 0) | (x == 1)))


def _check_bootstrap(seed: int, resamples: int) -> None:
    check_int_at_least("seed", seed, 0)
    check_int_at_least("resamples", resamples, 100)


def bootstrap_means(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """``resamples`` means of ``x`` resampled with replacement (vectorised, in bounded chunks)."""
    n = x.size
    out = np.empty(resamples, dtype=np.float64)
    step = max(1, _CHUNK_CELLS // n)
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = x[idx].mean(axis=1)
    return out


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def mean_interval(scores: Sequence[float], *, seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean score with a 95% interval.

    All scores 0 or 1: the Wilson interval of (sum, n). Otherwise the percentile bootstrap:
    the 2.5th and 97.5th percentiles of ``resamples`` means of samples drawn with replacement,
    seeded by ``seed`` so a report is reproducible.
    """
    x = _scores_array("scores", scores)
    mean = float(x.mean())
    if _is_binary(x):
        lo, hi = wilson_interval(int(x.sum()), int(x.size))
        return mean, lo, hi
    _check_bootstrap(seed, resamples)
    lo, hi = _percentiles(bootstrap_means(x, np.random.default_rng(seed), resamples))
    return mean, lo, hi


def value_interval(values: Sequence[float], *, seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of unbounded ``values`` (a KL divergence, a paired difference of
    them) with its 95% percentile-bootstrap interval, seeded by ``seed``."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or not x.size or not np.isfinite(x).all():
        raise ValueError(f"values must be a non-empty 1-D sequence of finite numbers, got {list(values)[:5]}")
    _check_bootstrap(seed, resamples)
    lo, hi = _percentiles(bootstrap_means(x, np.random.default_rng(seed), resamples))
    return float(x.mean()), lo, hi


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign-test p-value of ``wins`` against ``losses`` (ties dropped).

    For 0/1 scores the wins and losses are the discordant pairs and this is the exact
    McNemar test: 2·P[Binomial(w + l, 1/2) <= min(w, l)], capped at 1.
    """
    check_int_at_least("wins", wins, 0)
    check_int_at_least("losses", losses, 0)
    k = wins + losses
    if k == 0:
        return 1.0
    tail = sum(math.comb(k, i) for i in range(min(wins, losses) + 1)) / 2**k
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedDifference:
    """Mean of a - b over paired samples, its 95% interval, and the per-sample tally.

    ``wins``: samples where a scored higher than b; ``losses``: lower; ``ties``: equal.
    ``p_sign``: the exact sign test of wins against losses (exact McNemar for 0/1 scores).
    """

    mean: float
    lo: float
    hi: float
    wins: int
    losses: int
    ties: int
    p_sign: float

    @property
    def n(self) -> int:
        return self.wins + self.losses + self.ties

    @property
    def significant(self) -> bool:
        """True when the interval excludes 0 and the exact sign test rejects at 5%: only then is
        the difference a finding. The percentile bootstrap alone is anti-conservative with few
        discordant pairs (4 wins, 0 losses in 20 pairs: interval [0.05, 0.40], p = 0.125)."""
        return (self.lo > 0 or self.hi < 0) and self.p_sign < 0.05


def _tally(d: np.ndarray) -> tuple[int, int, int]:
    """(wins, losses, ties): pairs whose difference is positive, negative, zero."""
    wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))
    return wins, losses, int(d.size) - wins - losses


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, seed: int = 0, resamples: int = 10_000
) -> PairedDifference:
    """The paired difference a - b of two methods scored on the same samples, in the same order.

    The interval is the percentile bootstrap of the mean of d_i = a_i - b_i: whole pairs are
    resampled, so the samples' shared difficulty cancels. It is used for 0/1 scores too (then
    d_i is -1, 0 or 1 and only the discordant pairs move the mean); ``p_sign`` adds the exact
    McNemar / sign test. Identical vectors give exactly 0 with interval [0, 0].
    """
    x = _scores_array("a", a)
    y = _scores_array("b", b)
    if x.size != y.size:
        raise ValueError(f"a and b must be paired (same length), got {x.size} and {y.size}")
    _check_bootstrap(seed, resamples)
    d = x - y
    wins, losses, ties = _tally(d)
    mean = float(d.mean())
    if wins == losses == 0:
        lo = hi = 0.0
    else:
        lo, hi = _percentiles(bootstrap_means(d, np.random.default_rng(seed), resamples))
    return PairedDifference(mean, lo, hi, wins, losses, ties, sign_test_p(wins, losses))


def macro_paired_difference(
    a_by_task: Mapping[str, Sequence[float]],
    b_by_task: Mapping[str, Sequence[float]],
    *,
    seed: int = 0,
    resamples: int = 10_000,
) -> PairedDifference:
    """The macro paired difference of two methods: the mean over tasks of each task's mean of
    d_i = a_i - b_i, so every task weighs the same (as in :func:`macro_interval`).

    The interval is a bootstrap stratified by task (each replicate resamples every task's pairs
    within that task and averages the task means); the tally and the exact sign test pool the
    pairs of all tasks. With one task it is :func:`paired_difference`; identical vectors give
    exactly 0 with interval [0, 0].
    """
    if not a_by_task or set(a_by_task) != set(b_by_task):
        raise ValueError(
            "a_by_task and b_by_task must name the same non-empty tasks, "
            f"got {sorted(a_by_task)} and {sorted(b_by_task)}"
        )
    if len(a_by_task) == 1:
        (task,) = a_by_task
        return paired_difference(a_by_task[task], b_by_task[task], seed=seed, resamples=resamples)
    _check_bootstrap(seed, resamples)
    diffs = {}
    for task in a_by_task:
        x, y = (
            _scores_array(f"a_by_task[{task!r}]", a_by_task[task]),
            _scores_array(f"b_by_task[{task!r}]", b_by_task[task]),
        )
        if x.size != y.size:
            raise ValueError(f"task {task!r}: a and b must be paired (same length), got {x.size} and {y.size}")
        diffs[task] = x - y
    wins, losses, ties = _tally(np.concatenate(list(diffs.values())))
    mean = float(np.mean([d.mean() for d in diffs.values()]))
    if wins == losses == 0:
        lo = hi = 0.0
    else:
        rng = np.random.default_rng(seed)
        lo, hi = _percentiles(np.mean([bootstrap_means(d, rng, resamples) for d in diffs.values()], axis=0))
    return PairedDifference(mean, lo, hi, wins, losses, ties, sign_test_p(wins, losses))


def macro_interval(
    scores_by_task: Mapping[str, Sequence[float]], *, seed: int = 0, resamples: int = 10_000
) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean over tasks of each task's mean score, with a 95% interval.

    Every task weighs the same whatever its sample count. For 0/1 scores the interval is the
    stratified Agresti–Coull one (see :func:`_stratified_agresti_coull`); otherwise a bootstrap
    stratified by task: each replicate resamples every task's samples within that task (so
    each task keeps its size) and averages the task means; the 2.5th and 97.5th percentiles
    of ``resamples`` replicates bound it. With a single task the macro mean is that task's
    mean and :func:`mean_interval` is returned, so the two tables agree.
    """
    if not scores_by_task:
        raise ValueError("scores_by_task must name at least one task")
    arrays = {task: _scores_array(f"scores_by_task[{task!r}]", s) for task, s in scores_by_task.items()}
    if len(arrays) == 1:
        return mean_interval(next(iter(arrays.values())), seed=seed, resamples=resamples)
    _check_bootstrap(seed, resamples)
    mean = float(np.mean([x.mean() for x in arrays.values()]))
    if all(np.all((x == 0) | (x == 1)) for x in arrays.values()):
        return (mean, *_stratified_agresti_coull(list(arrays.values()), mean))
    rng = np.random.default_rng(seed)
    replicates = np.mean([bootstrap_means(x, rng, resamples) for x in arrays.values()], axis=0)
    lo, hi = _percentiles(replicates)
    return mean, lo, hi


def _stratified_agresti_coull(arrays: list[np.ndarray], mean: float, z: float = Z95) -> tuple[float, float]:
    """The interval of a mean of T task accuracies (0/1 scores): mean ± z·sqrt(Σ var_t)/T with
    each task's Agresti–Coull variance p̃(1 - p̃)/(n + 4), p̃ = (s + 2)/(n + 4). Unlike the
    stratified bootstrap it does not collapse to a point when every task is at 0 or 1."""
    variance = 0.0
    for x in arrays:
        n, tilde = x.size, (float(x.sum()) + 2) / (x.size + 4)
        variance += tilde * (1 - tilde) / (n + 4)
    half = z * math.sqrt(variance) / len(arrays)
    return max(0.0, mean - half), min(1.0, mean + half)


__all__ = [
    "PairedDifference",
    "Z95",
    "bootstrap_means",
    "macro_interval",
    "macro_paired_difference",
    "mean_interval",
    "paired_difference",
    "sign_test_p",
    "wilson_interval",
]
