"""Aggregators: weights on the simplex, symmetric in the futures, and the documented formulas."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lorekv.aggregators import (
    AGGREGATORS,
    LogprobAggregator,
    LogprobConfig,
    MeanAggregator,
    MeanConfig,
    ReliabilityAggregator,
    ReliabilityConfig,
)
from lorekv.aggregators.reliability import average_ranks, spearman

NAMES = ["mean", "logprob", "reliability"]
fast = settings(max_examples=50, deadline=None)


def make_inputs(m: int, l: int, g: int, n: int, t: int, seed: int, ties: bool):
    gen = torch.Generator().manual_seed(seed)
    if ties:
        per_future = torch.randint(0, 3, (m, l, g, n), generator=gen).float()
    else:
        per_future = torch.rand(m, l, g, n, generator=gen)
    logprobs = -3 * torch.rand(m, t, generator=gen)
    entropies = 2 * torch.rand(m, t, generator=gen)
    return per_future, logprobs, entropies


shapes = st.tuples(
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 10),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)


@fast
@given(shape=shapes, name=st.sampled_from(NAMES))
def test_weights_on_simplex(shape, name):
    per_future, logprobs, entropies = make_inputs(*shape)
    u, w = AGGREGATORS.build(name).aggregate(per_future, logprobs, entropies)
    assert w.shape == (shape[0],)
    assert u.shape == per_future.shape[1:]
    assert bool((w >= 0).all())
    assert torch.isclose(w.sum(), torch.tensor(1.0), atol=1e-6)
    assert torch.allclose(u, torch.einsum("m,mlgn->lgn", w, per_future), atol=1e-6)


@fast
@given(shape=shapes, name=st.sampled_from(NAMES))
def test_identical_futures_aggregate_to_that_future(shape, name):
    per_future, logprobs, entropies = make_inputs(*shape)
    same = per_future[:1].expand_as(per_future).contiguous()
    u, _ = AGGREGATORS.build(name).aggregate(same, logprobs, entropies)
    assert torch.allclose(u, per_future[0], atol=1e-6)


@fast
@given(shape=shapes, name=st.sampled_from(NAMES))
def test_invariant_to_the_order_of_futures(shape, name):
    per_future, logprobs, entropies = make_inputs(*shape)
    perm = torch.randperm(shape[0], generator=torch.Generator().manual_seed(shape[5]))
    agg = AGGREGATORS.build(name)
    u, w = agg.aggregate(per_future, logprobs, entropies)
    u_p, w_p = agg.aggregate(per_future[perm], logprobs[perm], entropies[perm])
    assert torch.allclose(u_p, u, atol=1e-5)
    assert torch.allclose(w_p, w[perm], atol=1e-6)


@fast
@given(shape=shapes)
def test_mean_equals_torch_mean(shape):
    per_future, logprobs, entropies = make_inputs(*shape)
    u, w = MeanAggregator(MeanConfig()).aggregate(per_future, logprobs, entropies)
    assert torch.allclose(u, per_future.mean(dim=0), atol=1e-6)
    assert torch.allclose(w, torch.full_like(w, 1 / shape[0]))


@fast
@given(shape=shapes)
def test_logprob_with_beta_zero_is_the_mean(shape):
    per_future, logprobs, entropies = make_inputs(*shape)
    u, w = LogprobAggregator(LogprobConfig(beta=0.0)).aggregate(per_future, logprobs, entropies)
    assert torch.allclose(u, per_future.mean(dim=0), atol=1e-6)
    assert torch.allclose(w, torch.full_like(w, 1 / shape[0]))


@fast
@given(shape=shapes, beta=st.floats(0.01, 50))
def test_logprob_favours_the_most_likely_future(shape, beta):
    per_future, logprobs, entropies = make_inputs(*shape)
    w = LogprobAggregator(LogprobConfig(beta=beta)).weights(per_future, logprobs, entropies)
    best = int(logprobs.mean(dim=1).argmax())
    assert torch.isclose(w[best], w.max())
    expected = torch.softmax(beta * logprobs.double().mean(dim=1), dim=0).float()
    assert torch.allclose(w, expected, atol=1e-6)


@fast
@given(shape=shapes)
def test_reliability_with_zero_coefficients_is_the_mean(shape):
    per_future, logprobs, entropies = make_inputs(*shape)
    agg = ReliabilityAggregator(ReliabilityConfig(a_lp=0, a_ent=0, a_dis=0))
    u, w = agg.aggregate(per_future, logprobs, entropies)
    assert torch.allclose(u, per_future.mean(dim=0), atol=1e-6)
    assert torch.allclose(w, torch.full_like(w, 1 / shape[0]))


@fast
@given(
    m=st.integers(3, 6),
    l=st.integers(1, 3),
    g=st.integers(1, 3),
    n=st.integers(2, 12),
    seed=st.integers(0, 2**31 - 1),
    a_dis=st.floats(0.1, 5),
)
def test_reliability_downweights_an_outlier_future(m, l, g, n, seed, a_dis):
    gen = torch.Generator().manual_seed(seed)
    base = torch.stack([torch.randperm(n, generator=gen) for _ in range(l * g)]).view(l, g, n).float()
    scale = 1 + torch.rand(m - 1, 1, 1, 1, generator=gen)
    outlier = (n - 1 - base).unsqueeze(0)
    per_future = torch.cat([scale * base, outlier])
    logprobs, entropies = torch.full((m, 3), -1.0), torch.full((m, 3), 0.5)
    agg = ReliabilityAggregator(ReliabilityConfig(a_dis=a_dis))
    dis = agg.disagreement(per_future)
    assert torch.allclose(dis, torch.tensor([0.0] * (m - 1) + [2.0], dtype=torch.float64))
    w = agg.weights(per_future, logprobs, entropies)
    assert w[-1] < 1 / m
    assert bool((w[-1] < w[:-1]).all())


@pytest.mark.parametrize("name", NAMES)
def test_one_future_gets_weight_one(name):
    per_future, logprobs, entropies = make_inputs(1, 2, 2, 7, 4, 0, False)
    u, w = AGGREGATORS.build(name).aggregate(per_future, logprobs, entropies)
    assert torch.equal(w, torch.ones(1))
    assert torch.allclose(u, per_future[0])


def test_reliability_formula_by_hand():
    per_future, logprobs, entropies = make_inputs(4, 2, 3, 9, 5, 1, False)
    # spreads here: lp 0.33, ent 0.07, dis 0.14; the floors bind for lp and ent, not for dis
    cfg = ReliabilityConfig(a_lp=0.7, a_ent=1.3, a_dis=2.0, floor_lp=0.5, floor_ent=0.2, floor_dis=0.01, eps=1e-3)
    w = ReliabilityAggregator(cfg).weights(per_future, logprobs, entropies)

    def z(x, floor):
        return (x - x.mean()) / (max(float(x.std(unbiased=False)), floor) + cfg.eps)

    consensus = per_future.double().mean(0)
    rho = torch.tensor(
        [
            [
                [pearson(average_ranks(per_future[k, a, b]), average_ranks(consensus[a, b])) for b in range(3)]
                for a in range(2)
            ]
            for k in range(4)
        ]
    )
    dis = 1 - rho.flatten(1).mean(1)
    lp, ent = logprobs.double().mean(1), entropies.double().mean(1)
    expected = torch.softmax(
        cfg.a_lp * z(lp, cfg.floor_lp) - cfg.a_ent * z(ent, cfg.floor_ent) - cfg.a_dis * z(dis, cfg.floor_dis), 0
    )
    assert torch.allclose(w.double(), expected, atol=1e-6)


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


def test_average_ranks_share_ties():
    ranks = average_ranks(torch.tensor([[3.0, 1.0, 2.0, 2.0, 5.0]]))
    assert ranks.tolist() == [[4.0, 1.0, 2.5, 2.5, 5.0]]


def test_spearman_conventions_for_constant_vectors():
    const, ramp = torch.ones(5), torch.arange(5.0)
    assert spearman(const, 2 * const).item() == 1.0
    assert spearman(const, ramp).item() == 0.0
    assert spearman(ramp, const).item() == 0.0
    assert spearman(torch.tensor([3.0]), torch.tensor([1.0])).item() == 1.0
    assert spearman(ramp, ramp.flip(0)).item() == pytest.approx(-1.0)
    assert spearman(ramp, ramp**3).item() == pytest.approx(1.0)


def test_low_precision_scores_keep_their_dtype():
    per_future, logprobs, entropies = make_inputs(3, 2, 2, 6, 4, 2, False)
    u, w = AGGREGATORS.build("reliability").aggregate(per_future.bfloat16(), logprobs, entropies)
    assert u.dtype == torch.bfloat16 and w.dtype == torch.float32


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ({"name": "logprob", "beta": -0.1}, "beta"),
        ({"name": "logprob", "beta": float("inf")}, "beta"),
        ({"name": "reliability", "a_lp": -1}, "a_lp"),
        ({"name": "reliability", "a_ent": -1}, "a_ent"),
        ({"name": "reliability", "a_dis": -0.5}, "a_dis"),
        ({"name": "reliability", "eps": 0.0}, "eps"),
        ({"name": "reliability", "floor_lp": -0.1}, "floor_lp"),
        ({"name": "reliability", "floor_ent": float("inf")}, "floor_ent"),
        ({"name": "reliability", "floor_dis": -1e-9}, "floor_dis"),
        ({"name": "reliability", "eps": -1e-3}, "eps"),
        ({"name": "mean", "beta": 1.0}, "beta"),
    ],
)
def test_invalid_config_raises(spec, param):
    with pytest.raises(ValueError, match=param):
        AGGREGATORS.build(spec)


@pytest.mark.parametrize("name", NAMES)
def test_invalid_inputs_raise_naming_the_argument(name):
    agg = AGGREGATORS.build(name)
    per_future, logprobs, entropies = make_inputs(3, 2, 2, 5, 4, 0, False)
    with pytest.raises(ValueError, match="logprobs"):
        agg.aggregate(per_future, logprobs[:2], entropies[:2])
    with pytest.raises(ValueError, match="logprobs"):
        agg.weights(per_future, logprobs[:2], entropies[:2])
    with pytest.raises(ValueError, match="entropies"):
        agg.aggregate(per_future, logprobs, entropies[:, :2])
    with pytest.raises(ValueError, match="per_future"):
        agg.aggregate(per_future[:0], logprobs[:0], entropies[:0])
    with pytest.raises(ValueError, match="per_future"):
        agg.aggregate(per_future[0], logprobs, entropies)


@pytest.mark.parametrize("name", ["logprob", "reliability"])
def test_token_statistics_must_exist_and_be_finite(name):
    agg = AGGREGATORS.build(name)
    per_future, logprobs, entropies = make_inputs(3, 2, 2, 5, 4, 0, False)
    with pytest.raises(ValueError, match="logprobs"):
        agg.aggregate(per_future, logprobs[:, :0], entropies[:, :0])
    with pytest.raises(ValueError, match="logprobs"):
        agg.aggregate(per_future, logprobs.index_fill(1, torch.tensor([0]), float("-inf")), entropies)
    with pytest.raises(ValueError, match="entropies"):
        agg.aggregate(per_future, logprobs, entropies.index_fill(1, torch.tensor([0]), float("nan")))


@pytest.mark.parametrize("name", NAMES)
def test_registry_round_trip(name):
    agg = AGGREGATORS.build(name)
    again = AGGREGATORS.build(agg.config.model_dump())
    assert type(again) is type(agg) and again.config == agg.config
    assert isinstance(AGGREGATORS.parse({"name": "reliability", "a_dis": 2}), ReliabilityConfig)
