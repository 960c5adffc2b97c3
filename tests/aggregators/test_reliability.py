"""The reliability aggregator's floored standardisation (issue 22): weights that hold still.

z(x)_m = (x_m - mean(x)) / (max(std(x), floor) + eps). The reference below recomputes the
weights from that formula in plain Python (its own average ranks and Spearman correlation),
independently of the library's helpers, and the properties pin what the floor is for:
weights continuous in the inputs on the floor's scale, no collapse of two futures onto one
for noise-size differences, and the old scale-free weights wherever the spread exceeds it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lorekv.aggregators import AGGREGATORS, ReliabilityAggregator, ReliabilityConfig

fast = settings(max_examples=50, deadline=None)


# ---------------------------------------------------------------- an independent reference


def ranks(xs: list[float]) -> list[float]:
    """1-based average ranks: 1 + #{smaller} + (#{equal} - 1) / 2."""
    return [1 + sum(y < x for y in xs) + (sum(y == x for y in xs) - 1) / 2 for x in xs]


def spearman_ref(xs: list[float], ys: list[float]) -> float:
    """Pearson correlation of the average ranks; two constant vectors 1, one constant 0."""
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cx, cy = [r - mx for r in rx], [r - my for r in ry]
    sxx, syy = sum(c * c for c in cx), sum(c * c for c in cy)
    if sxx == 0 or syy == 0:
        return 1.0 if sxx == syy else 0.0
    return sum(a * b for a, b in zip(cx, cy, strict=True)) / math.sqrt(sxx * syy)


def z_ref(xs: list[float], floor: float, eps: float) -> list[float]:
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return [(x - mean) / (max(std, floor) + eps) for x in xs]


def signals_ref(per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor):
    """(lp, ent, dis) per future, as Python floats."""
    lp = [sum(row) / len(row) for row in logprobs.double().tolist()]
    ent = [sum(row) / len(row) for row in entropies.double().tolist()]
    u = per_future.double()
    m, num_layers, num_groups, _ = u.shape
    consensus = u.mean(0)
    dis = []
    for k in range(m):
        rhos = [
            spearman_ref(u[k, a, b].tolist(), consensus[a, b].tolist())
            for a in range(num_layers)
            for b in range(num_groups)
        ]
        dis.append(1 - sum(rhos) / len(rhos))
    return lp, ent, dis


def weights_ref(per_future, logprobs, entropies, cfg: ReliabilityConfig) -> list[float]:
    lp, ent, dis = signals_ref(per_future, logprobs, entropies)
    z_lp, z_ent = z_ref(lp, cfg.floor_lp, cfg.eps), z_ref(ent, cfg.floor_ent, cfg.eps)
    z_dis = z_ref(dis, cfg.floor_dis, cfg.eps)
    logits = [cfg.a_lp * a - cfg.a_ent * b - cfg.a_dis * c for a, b, c in zip(z_lp, z_ent, z_dis, strict=True)]
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    return [e / sum(exps) for e in exps]


# ---------------------------------------------------------------- inputs at every spread

spread = st.one_of(st.just(0.0), st.floats(-9, 1).map(lambda e: 10.0**e))


@st.composite
def futures(draw: st.DrawFn, min_m: int = 2, max_m: int = 8, dtype: torch.dtype = torch.float64):
    """(per_future, logprobs, entropies) whose three signals spread across the futures by
    anything from 0 through noise size (1e-9) and around the floors to several nats."""
    m, t = draw(st.integers(min_m, max_m)), draw(st.integers(1, 8))
    num_layers, num_groups, n = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(2, 9))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    s_lp, s_ent, s_dis = draw(spread), draw(spread), draw(spread)
    logprobs = -1.5 + s_lp * torch.randn(m, t, generator=gen, dtype=torch.float64)
    entropies = 1.0 + s_ent * torch.randn(m, t, generator=gen, dtype=torch.float64)
    base = torch.rand(1, num_layers, num_groups, n, generator=gen, dtype=torch.float64)
    noise = torch.rand(m, num_layers, num_groups, n, generator=gen, dtype=torch.float64)
    per_future = base + s_dis * noise
    return per_future.to(dtype), logprobs.to(dtype), entropies.to(dtype)


configs = st.builds(
    ReliabilityConfig,
    a_lp=st.floats(0, 3),
    a_ent=st.floats(0, 3),
    a_dis=st.floats(0, 3),
    floor_lp=st.floats(0.01, 2),
    floor_ent=st.floats(0.01, 2),
    floor_dis=st.floats(1e-3, 0.5),
)


# ---------------------------------------------------------------- the properties


@fast
@given(inputs=futures(min_m=1), cfg=configs)
def test_weights_match_the_reference_formula(inputs, cfg):
    w = ReliabilityAggregator(cfg).weights(*inputs)
    assert w.dtype == torch.float64
    assert w.tolist() == pytest.approx(weights_ref(*inputs, cfg), abs=1e-9)


@fast
@given(inputs=futures(), data=st.data(), sign=st.sampled_from([-1.0, 1.0]))
def test_a_1e5_change_of_one_logprob_moves_no_weight_by_more_than_1e3(inputs, data, sign):
    """The issue's bound, at the default config, for M = 2..8 and any spread."""
    per_future, logprobs, entropies = inputs
    m, t = logprobs.shape
    k, j = data.draw(st.integers(0, m - 1)), data.draw(st.integers(0, t - 1))
    agg = ReliabilityAggregator(ReliabilityConfig())
    moved = logprobs.clone()
    moved[k, j] += sign * 1e-5
    change = (agg.weights(per_future, moved, entropies) - agg.weights(per_future, logprobs, entropies)).abs()
    assert float(change.max()) <= 1e-3


@fast
@given(inputs=futures(), cfg=configs, data=st.data(), delta=st.floats(1e-7, 1e-3))
def test_weights_are_lipschitz_in_the_mean_logprob_on_the_floors_scale(inputs, cfg, data, delta):
    """|dw| <= a_lp |d lp| / (2 floor_lp): the documented bound, for any config and spread."""
    per_future, logprobs, entropies = inputs
    m, t = logprobs.shape
    k, j = data.draw(st.integers(0, m - 1)), data.draw(st.integers(0, t - 1))
    agg = ReliabilityAggregator(cfg)
    moved = logprobs.clone()
    moved[k, j] += delta
    change = (agg.weights(per_future, moved, entropies) - agg.weights(per_future, logprobs, entropies)).abs()
    bound = cfg.a_lp * (delta / t) / (2 * cfg.floor_lp)
    assert float(change.max()) <= bound * (1 + 1e-6) + 1e-12


@pytest.mark.parametrize("difference", [1e-12, 1e-8, 1e-5, 1e-3])
@pytest.mark.parametrize("signal", ["logprobs", "entropies"])
def test_two_futures_do_not_collapse_onto_one_for_tiny_differences(difference, signal):
    """M = 2: below the floor the weights are sigmoid(a d / (floor + eps)), near 1/2; the old
    rule (floors 0) gave 0.88/0.12 (or more, with both signals) for any d > 0."""
    per_future = torch.rand(2, 2, 2, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    per_future[1] = per_future[0]  # no disagreement
    stats = {"logprobs": torch.full((2, 4), -1.0, dtype=torch.float64), "entropies": torch.ones(2, 4).double()}
    stats[signal][0] += difference
    cfg = ReliabilityConfig()
    w = ReliabilityAggregator(cfg).weights(per_future, stats["logprobs"], stats["entropies"])
    a, floor = (cfg.a_lp, cfg.floor_lp) if signal == "logprobs" else (-cfg.a_ent, cfg.floor_ent)
    expected = 1 / (1 + math.exp(-a * difference / (floor + cfg.eps)))
    assert w.tolist() == pytest.approx([expected, 1 - expected], abs=1e-12)
    assert float(w.min()) > 0.45  # not 0.88/0.12
    old = ReliabilityAggregator(ReliabilityConfig(floor_lp=0, floor_ent=0, floor_dis=0))
    w_old = old.weights(per_future, stats["logprobs"], stats["entropies"])
    if difference > 1e-5:  # well above eps: the old rule standardises d to +-1
        assert abs(float(w_old[0]) - 0.5) > 0.35


@pytest.mark.parametrize("m", [2, 3, 4, 8])
def test_two_futures_weights_are_continuous_across_the_floor(m):
    """Sweeping the spread of the log-probs through the floor, the weights move by small
    steps (no jump where std(x) crosses floor_lp) and tend to uniform as the spread shrinks."""
    cfg = ReliabilityConfig(a_ent=0, a_dis=0)
    agg = ReliabilityAggregator(cfg)
    gen = torch.Generator().manual_seed(m)
    shape = torch.randn(m, 1, generator=gen, dtype=torch.float64)
    per_future = torch.rand(m, 1, 1, 5, generator=gen, dtype=torch.float64)
    entropies = torch.ones(m, 1, dtype=torch.float64)
    scales = torch.logspace(-6, 1, 701, dtype=torch.float64)
    previous = None
    for scale in scales:
        w = agg.weights(per_future, -1 + scale * shape, entropies)
        if previous is not None:
            assert float((w - previous).abs().max()) < 0.02
        previous = w
    # futures 1e-4 nats/token apart: near uniform (|z| <= 2 max|x| / floor), where the old
    # rule (floors 0) standardised the differences to full size
    close = -1 + 1e-4 * shape
    w = agg.weights(per_future, close, entropies)
    assert torch.allclose(w, torch.full_like(w, 1 / m), atol=2e-4 * float(shape.abs().max()) / cfg.floor_lp)
    old = ReliabilityAggregator(cfg.model_copy(update={"floor_lp": 0.0})).weights(per_future, close, entropies)
    assert float((old - 1 / m).abs().max()) > 0.05


@fast
@given(inputs=futures(min_m=1), cfg=configs)
def test_identical_futures_get_equal_weights(inputs, cfg):
    per_future, logprobs, entropies = inputs
    m = per_future.shape[0]
    same = [x[:1].expand_as(x).contiguous() for x in (per_future, logprobs, entropies)]
    for config in (cfg, cfg.model_copy(update={"floor_lp": 0.0, "floor_ent": 0.0, "floor_dis": 0.0})):
        w = ReliabilityAggregator(config).weights(*same)
        assert torch.allclose(w, torch.full_like(w, 1 / m), atol=1e-12)


@fast
@given(inputs=futures(min_m=1), cfg=configs, seed=st.integers(0, 2**31 - 1))
def test_permuting_the_futures_permutes_the_weights(inputs, cfg, seed):
    per_future, logprobs, entropies = inputs
    perm = torch.randperm(per_future.shape[0], generator=torch.Generator().manual_seed(seed))
    agg = ReliabilityAggregator(cfg)
    u, w = agg.aggregate(per_future, logprobs, entropies)
    u_p, w_p = agg.aggregate(per_future[perm], logprobs[perm], entropies[perm])
    assert torch.allclose(w_p, w[perm], atol=1e-12)
    assert torch.allclose(u_p, u, atol=1e-12)


@fast
@given(inputs=futures(min_m=1), cfg=configs)
def test_weights_lie_on_the_simplex(inputs, cfg):
    w = ReliabilityAggregator(cfg).weights(*inputs)
    assert bool((w >= 0).all())
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-12)


@fast
@given(inputs=futures(min_m=2), cfg=configs)
def test_spreads_above_the_floors_give_the_old_standardised_weights(inputs, cfg):
    """Where every signal's std exceeds its floor, the weights are exactly those of the
    unfloored rule z = (x - mean) / (std + eps) (the old behaviour, floors 0)."""
    per_future, logprobs, entropies = inputs
    lp, ent, dis = signals_ref(per_future, logprobs, entropies)

    def std(xs):
        mean = sum(xs) / len(xs)
        return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))

    spreads = (std(lp), std(ent), std(dis))
    floors = [min(s / 2, f) for s, f in zip(spreads, (cfg.floor_lp, cfg.floor_ent, cfg.floor_dis), strict=True)]
    above = cfg.model_copy(update=dict(zip(("floor_lp", "floor_ent", "floor_dis"), floors, strict=True)))
    unfloored = cfg.model_copy(update={"floor_lp": 0.0, "floor_ent": 0.0, "floor_dis": 0.0})
    w = ReliabilityAggregator(above).weights(per_future, logprobs, entropies)
    w_old = ReliabilityAggregator(unfloored).weights(per_future, logprobs, entropies)
    assert torch.equal(w, w_old)
    old_ref = weights_ref(per_future, logprobs, entropies, unfloored)
    assert w.tolist() == pytest.approx(old_ref, abs=1e-9)


@fast
@given(inputs=futures(min_m=1), cfg=configs)
def test_zero_coefficients_give_the_plain_mean(inputs, cfg):
    per_future, logprobs, entropies = inputs
    zero = cfg.model_copy(update={"a_lp": 0.0, "a_ent": 0.0, "a_dis": 0.0})
    u, w = ReliabilityAggregator(zero).aggregate(per_future, logprobs, entropies)
    assert torch.allclose(w, torch.full_like(w, 1 / per_future.shape[0]), atol=1e-15)
    assert torch.allclose(u, per_future.mean(dim=0), atol=1e-12)


@fast
@given(inputs=futures(min_m=1, dtype=torch.float32))
def test_float32_and_float64_inputs_agree(inputs):
    """The same (float32-representable) inputs give the same weights in either dtype: the
    statistics are float64 inside, and the floor keeps rounding-size differences small."""
    agg = ReliabilityAggregator(ReliabilityConfig())
    w32 = agg.weights(*inputs)
    w64 = agg.weights(*(x.double() for x in inputs))
    assert w32.dtype == torch.float32 and w64.dtype == torch.float64
    assert torch.allclose(w32.double(), w64, atol=1e-6)


@pytest.mark.parametrize("field", ["floor_lp", "floor_ent", "floor_dis"])
@pytest.mark.parametrize("value", [-1e-3, float("inf"), float("nan")])
def test_invalid_floors_raise_naming_the_field_and_range(field, value):
    with pytest.raises(ValueError, match=rf"{field} must lie in \[0\.0, inf\)"):
        AGGREGATORS.build({"name": "reliability", field: value})


def test_zero_floors_are_allowed_and_are_the_old_rule():
    cfg = ReliabilityConfig(floor_lp=0, floor_ent=0, floor_dis=0)
    per_future = torch.rand(2, 1, 1, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    per_future[1] = per_future[0]
    logprobs = torch.tensor([[-1.0], [-1.0 - 1e-4]], dtype=torch.float64)
    entropies = torch.ones(2, 1, dtype=torch.float64)
    w = ReliabilityAggregator(cfg).weights(per_future, logprobs, entropies)
    # z = +-1e-4/2 / (1e-4/2 + 1e-6): the signs alone decide, as in the paper's z-score
    z = 0.5e-4 / (0.5e-4 + 1e-6)
    assert float(w[0]) == pytest.approx(1 / (1 + math.exp(-2 * z)), abs=1e-12)
