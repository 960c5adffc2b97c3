"""Intervals and paired differences: textbook values, properties, determinism and coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lorekv.eval.stats import (
    macro_interval,
    macro_paired_difference,
    mean_interval,
    paired_difference,
    sign_test_p,
    wilson_interval,
)

binary = st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=60)
fractional = st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=40).filter(
    lambda xs: any(0 < x < 1 for x in xs)
)


def brute_force_wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson interval by its definition: every p whose score test |p̂ - p| / sqrt(p(1-p)/n) <= z."""
    grid = np.linspace(0, 1, 200_001)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = np.abs(k / n - grid) / np.sqrt(grid * (1 - grid) / n)
    accepted = grid[(stat <= z) | ((grid == k / n) & np.isnan(stat))]
    return float(accepted.min()), float(accepted.max())


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [(10, 12, (0.552, 0.953)), (7, 10, (0.397, 0.892)), (0, 10, (0.0, 0.278)), (10, 10, (0.722, 1.0)),
     (1, 2, (0.095, 0.905))],
)  # fmt: skip
def test_wilson_matches_textbook_values(k: int, n: int, expected: tuple[float, float]) -> None:
    lo, hi = wilson_interval(k, n)
    assert (round(lo, 3), round(hi, 3)) == expected


@pytest.mark.parametrize(("k", "n"), [(10, 12), (3, 7), (0, 5), (20, 20), (37, 50)])
def test_wilson_matches_the_inverted_score_test(k: int, n: int) -> None:
    lo, hi = wilson_interval(k, n)
    blo, bhi = brute_force_wilson(k, n)
    assert lo == pytest.approx(blo, abs=1e-4) and hi == pytest.approx(bhi, abs=1e-4)


@pytest.mark.parametrize(
    ("args", "name"), [((0, 0), "n"), ((-1, 5), "successes"), ((6, 5), "successes"), ((True, 5), "successes")]
)
def test_wilson_rejects_bad_counts_by_name(args: tuple[int, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        wilson_interval(*args)


def test_wilson_covers_p_in_at_least_93_percent_of_simulated_draws() -> None:
    rng = np.random.default_rng(1)
    p, n = 0.7, 20
    covered = sum(lo <= p <= hi for lo, hi in (wilson_interval(int(k), n) for k in rng.binomial(n, p, size=2000)))
    assert covered / 2000 >= 0.93


def test_bootstrap_covers_the_mean_of_fractional_scores_in_about_95_percent() -> None:
    rng = np.random.default_rng(2)
    hits = 0
    for trial in range(300):
        scores = rng.beta(2, 3, size=40)  # true mean 0.4
        _, lo, hi = mean_interval(scores, seed=trial, resamples=2000)
        hits += lo <= 0.4 <= hi
    assert hits / 300 >= 0.88


@given(binary)
def test_binary_means_use_wilson(scores: list[float]) -> None:
    mean, lo, hi = mean_interval(scores)
    assert mean == sum(scores) / len(scores)
    assert (lo, hi) == wilson_interval(int(sum(scores)), len(scores))


@given(st.one_of(binary, fractional), st.integers(0, 2**16))
def test_intervals_contain_the_mean_and_lie_in_unit_interval(scores: list[float], seed: int) -> None:
    mean, lo, hi = mean_interval(scores, seed=seed, resamples=1000)
    assert 0 <= lo <= mean + 1e-12 and mean - 1e-12 <= hi <= 1


@given(fractional, st.integers(0, 2**16))
def test_bootstrap_is_deterministic_for_a_seed(scores: list[float], seed: int) -> None:
    assert mean_interval(scores, seed=seed, resamples=500) == mean_interval(scores, seed=seed, resamples=500)


@given(st.integers(1, 30), st.integers(0, 30))
def test_wilson_shrinks_with_n(n: int, k: int) -> None:
    k = min(k, n)
    lo, hi = wilson_interval(k, n)
    lo4, hi4 = wilson_interval(4 * k, 4 * n)
    assert hi4 - lo4 < hi - lo


@given(fractional)
def test_bootstrap_shrinks_with_n(scores: list[float]) -> None:
    _, lo, hi = mean_interval(scores, resamples=4000)
    _, lo9, hi9 = mean_interval(scores * 9, resamples=4000)
    assert hi9 - lo9 <= (hi - lo) / 2 + 1e-9  # ~1/3 expected


def test_bootstrap_differs_between_seeds() -> None:
    scores = np.linspace(0.05, 0.95, 15)
    assert mean_interval(scores, seed=0) != mean_interval(scores, seed=1)


@pytest.mark.parametrize(("scores", "name"), [([], "scores"), ([0.5, 1.2], "scores"), ([float("nan")], "scores")])
def test_mean_interval_rejects_bad_scores(scores: list[float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        mean_interval(scores)


def test_mean_interval_rejects_too_few_resamples() -> None:
    with pytest.raises(ValueError, match="resamples"):
        mean_interval([0.2, 0.5], resamples=10)


@given(st.one_of(binary, fractional))
def test_paired_difference_of_identical_vectors_is_exactly_zero(scores: list[float]) -> None:
    diff = paired_difference(scores, scores)
    assert (diff.mean, diff.lo, diff.hi) == (0.0, 0.0, 0.0)
    assert (diff.wins, diff.losses, diff.ties) == (0, 0, len(scores))
    assert diff.p_sign == 1.0 and not diff.significant


def test_paired_difference_counts_and_sign() -> None:
    a = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    b = [1, 1, 1, 1, 1, 0, 0, 1, 0, 0]  # a wins at 5, 6; loses at 7
    diff = paired_difference(a, b, seed=3)
    assert diff.mean == pytest.approx(0.1)
    assert (diff.wins, diff.losses, diff.ties, diff.n) == (2, 1, 7, 10)
    assert diff.lo < 0 < diff.hi and not diff.significant
    assert diff.p_sign == 1.0  # 2 vs 1 discordant: exact McNemar p = 2 * P[Bin(3, .5) <= 1] = 1
    flipped = paired_difference(b, a, seed=3)
    assert flipped.mean == pytest.approx(-0.1) and (flipped.wins, flipped.losses) == (1, 2)


def test_paired_difference_finds_a_consistent_gain() -> None:
    a = [1.0] * 18 + [0.0] * 2
    b = [0.0] * 18 + [0.0] * 2
    diff = paired_difference(a, b)
    assert diff.mean == pytest.approx(0.9) and diff.lo > 0 and diff.significant
    assert diff.p_sign == pytest.approx(2 / 2**18)


def test_paired_difference_needs_pairs() -> None:
    with pytest.raises(ValueError, match="a and b"):
        paired_difference([1, 0], [1, 0, 1])


@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=30), st.data())
def test_paired_interval_holds_the_mean_difference(a: list[float], data: st.DataObject) -> None:
    b = data.draw(st.lists(st.floats(0, 1, allow_nan=False), min_size=len(a), max_size=len(a)))
    diff = paired_difference(a, b, resamples=1000)
    assert -1 <= diff.lo <= diff.mean + 1e-12 and diff.mean - 1e-12 <= diff.hi <= 1


@pytest.mark.parametrize(
    ("w", "l", "p"), [(0, 0, 1.0), (5, 0, 2 / 32), (0, 5, 2 / 32), (3, 3, 1.0), (8, 2, 112 / 1024)]
)
def test_sign_test_exact_values(w: int, l: int, p: float) -> None:
    assert sign_test_p(w, l) == pytest.approx(p)


def test_macro_weighs_tasks_equally() -> None:
    mean, lo, hi = macro_interval({"a": [1.0] * 4, "b": [1.0] * 10 + [0.0] * 10}, resamples=2000)
    assert mean == pytest.approx(0.75)  # (1.0 + 0.5) / 2, not 14/24
    assert lo < 0.75 < hi and hi <= 1.0


def test_macro_of_one_task_is_its_mean_interval() -> None:
    assert macro_interval({"a": [1, 1, 0, 1]}) == mean_interval([1, 1, 0, 1])


def test_macro_stratifies_by_task() -> None:
    """A task with a constant (fractional) score adds no variance: the interval is half the other task's."""
    varied = [0.9] * 10 + [0.1] * 10
    _, lo, hi = macro_interval({"a": varied, "b": [0.5] * 20}, resamples=20_000)
    # stratified: sd = 0.5 * sd(mean of a) = 0.5 * 0.4 / sqrt(20); pooled over 40 samples it would be wider
    assert math.isclose(hi - lo, 2 * 1.96 * 0.5 * 0.4 / math.sqrt(20), rel_tol=0.15)


def test_macro_of_binary_tasks_at_the_edges_is_not_a_point() -> None:
    """Every task at 20/20: the stratified bootstrap would give [1, 1]; Agresti–Coull does not."""
    mean, lo, hi = macro_interval({"a": [1.0] * 20, "b": [1.0] * 20})
    tilde = 22 / 24
    half = 1.96 * math.sqrt(2 * tilde * (1 - tilde) / 24) / 2
    assert mean == hi == 1.0 and lo == pytest.approx(1.0 - half) and lo < 0.95
    mean, lo, hi = macro_interval({"a": [0.0] * 20, "b": [1.0] * 20})
    assert mean == 0.5 and lo < 0.5 < hi


def test_few_one_sided_discordant_pairs_are_not_a_finding() -> None:
    """4 wins, 0 losses, 16 ties: the bootstrap interval excludes 0, exact McNemar p = 0.125."""
    diff = paired_difference([1.0] * 4 + [0.0] * 16, [0.0] * 20)
    assert diff.lo > 0 and diff.p_sign == pytest.approx(0.125) and not diff.significant
    strong = paired_difference([1.0] * 8 + [0.0] * 12, [0.0] * 20)
    assert strong.p_sign == pytest.approx(2 / 2**8) and strong.significant


@given(st.dictionaries(st.sampled_from("abcd"), st.one_of(binary, fractional), min_size=1), st.integers(0, 100))
def test_macro_interval_contains_the_mean_and_is_deterministic(scores: dict[str, list[float]], seed: int) -> None:
    mean, lo, hi = macro_interval(scores, seed=seed, resamples=500)
    assert mean == pytest.approx(float(np.mean([np.mean(s) for s in scores.values()])))
    assert 0 <= lo <= mean + 1e-12 and mean - 1e-12 <= hi <= 1
    assert macro_interval(scores, seed=seed, resamples=500) == (mean, lo, hi)


def test_macro_rejects_no_tasks_and_names_a_bad_task() -> None:
    with pytest.raises(ValueError, match="scores_by_task"):
        macro_interval({})
    with pytest.raises(ValueError, match="'b'"):
        macro_interval({"a": [1.0], "b": []})


def test_paired_difference_resamples_pairs_not_methods() -> None:
    """Two methods that differ by ~0.048 on every sample of widely spread difficulty: resampling
    pairs gives a narrow interval around 0.048; resampling each method on its own (unpaired)
    would give one about six times wider that covers 0."""
    rng = np.random.default_rng(5)
    a = rng.uniform(0.1, 0.9, 40)
    b = a - 0.048 + rng.uniform(-0.002, 0.002, 40)
    diff = paired_difference(a.tolist(), b.tolist(), seed=1, resamples=4000)
    d = a - b
    brute = [d[rng.integers(0, 40, 40)].mean() for _ in range(4000)]
    lo, hi = np.percentile(brute, [2.5, 97.5])
    assert 0.045 < diff.lo < diff.mean < diff.hi < 0.051
    assert abs(diff.lo - lo) < 5e-4 and abs(diff.hi - hi) < 5e-4, (diff, lo, hi)


def test_macro_paired_difference_of_one_task_is_the_paired_difference() -> None:
    a, b = [1.0, 0.0, 1.0, 1.0, 0.5], [0.0, 0.0, 1.0, 0.0, 1.0]
    assert macro_paired_difference({"t": a}, {"t": b}, seed=3, resamples=500) == paired_difference(
        a, b, seed=3, resamples=500
    )


@given(st.dictionaries(st.sampled_from("abc"), st.one_of(binary, fractional), min_size=1))
def test_macro_paired_difference_of_identical_methods_is_exactly_zero(scores: dict[str, list[float]]) -> None:
    diff = macro_paired_difference(scores, scores, resamples=200)
    assert (diff.mean, diff.lo, diff.hi, diff.wins, diff.losses) == (0.0, 0.0, 0.0, 0, 0)
    assert diff.ties == sum(map(len, scores.values())) and not diff.significant


def test_macro_paired_difference_weighs_tasks_equally_and_bootstraps_within_tasks() -> None:
    """Task a: +1 on 4 of 4 pairs; task b: 0 on 36 pairs. Pooled the mean would be 0.1, macro it is
    0.5; task b adds no variance and task a none either (every pair +1), so the interval is [0.5, 0.5]
    under resampling within tasks (a bootstrap over the pooled pairs would spread it)."""
    diff = macro_paired_difference({"a": [1.0] * 4, "b": [0.0] * 36}, {"a": [0.0] * 4, "b": [0.0] * 36})
    assert diff.mean == pytest.approx(0.5) and diff.lo == pytest.approx(0.5) and diff.hi == pytest.approx(0.5)
    assert (diff.wins, diff.losses, diff.ties) == (4, 0, 36) and diff.p_sign == pytest.approx(0.125)


def test_macro_paired_difference_matches_a_brute_force_stratified_bootstrap() -> None:
    rng = np.random.default_rng(7)
    a = {"x": rng.uniform(0, 1, 12), "y": rng.uniform(0, 1, 30)}
    b = {t: np.clip(v - rng.uniform(-0.1, 0.3, v.size), 0, 1) for t, v in a.items()}
    diff = macro_paired_difference(
        {t: v.tolist() for t, v in a.items()}, {t: v.tolist() for t, v in b.items()}, seed=2, resamples=4000
    )
    d = {t: a[t] - b[t] for t in a}
    assert diff.mean == pytest.approx(np.mean([d["x"].mean(), d["y"].mean()]))
    brute = [np.mean([v[rng.integers(0, v.size, v.size)].mean() for v in d.values()]) for _ in range(4000)]
    lo, hi = np.percentile(brute, [2.5, 97.5])
    assert abs(diff.lo - lo) < 0.01 and abs(diff.hi - hi) < 0.01, (diff, lo, hi)


def test_macro_paired_difference_rejects_unmatched_tasks_and_pairs_by_name() -> None:
    with pytest.raises(ValueError, match="same non-empty tasks"):
        macro_paired_difference({"a": [1.0]}, {"b": [1.0]})
    with pytest.raises(ValueError, match="task 'b'.*paired"):
        macro_paired_difference({"a": [1.0], "b": [1.0, 0.0]}, {"a": [0.0], "b": [1.0]})
