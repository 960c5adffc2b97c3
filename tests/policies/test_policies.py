"""Policies: exact budgets, protected tokens, deterministic top-k, validated configs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lorekv.policies import (
    POLICIES,
    GlobalConfig,
    GlobalPolicy,
    PerHeadConfig,
    PerHeadPolicy,
    PerLayerConfig,
    PerLayerPolicy,
    ThresholdConfig,
    ThresholdPolicy,
    UniformConfig,
    UniformPolicy,
    pyramid_budgets,
)
from lorekv.policies.topk import largest_remainder
from lorekv.scores import Scores, Selection

fast = settings(max_examples=50, deadline=None)


@st.composite
def cases(draw, max_layers: int = 4, max_heads: int = 4, max_tokens: int = 48):
    """(scores, budget, sink, recent); ``budget`` always holds the protected tokens.

    Most examples are the realistic regime (n >= 32, G > 1, B < n: see
    ``test_case_strategy_mostly_draws_the_realistic_regime``); the rest cover the edges (tiny
    n, one head, B >= n). Heads get scales from 1e-3 to 1e3, as LOO scores do.
    """
    realistic = draw(st.integers(0, 9)) < 8
    l = draw(st.integers(1, max_layers))
    g = draw(st.integers(2, max_heads)) if realistic else draw(st.integers(1, max_heads))
    n = draw(st.integers(32, max_tokens)) if realistic else draw(st.integers(1, max_tokens))
    sink, recent = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    low = max(1, min(sink + recent, n))
    budget = draw(st.integers(low, n - 1)) if realistic and low < n else draw(st.integers(low, n + 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        values = torch.randint(0, 4, (l, g, n), generator=gen).float()
    else:
        values = torch.rand(l, g, n, generator=gen)
    if draw(st.booleans()):
        values = values * 10.0 ** torch.randint(-3, 4, (l, g, 1), generator=gen).float()
    return Scores(values, tuple(range(3, 3 + l))), budget, sink, recent


def test_case_strategy_mostly_draws_the_realistic_regime() -> None:
    import warnings

    from hypothesis.errors import NonInteractiveExampleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        drawn = [cases().example() for _ in range(300)]
    realistic = [s.num_tokens >= 32 and s.num_kv_heads > 1 and b < s.num_tokens for s, b, _, _ in drawn]
    assert sum(realistic) / len(drawn) >= 0.6


def protected(n: int, sink: int, recent: int) -> torch.Tensor:
    j = torch.arange(n)
    return (j < sink) | (j >= n - recent)


def normalised(values: torch.Tensor) -> torch.Tensor:
    total = values.sum(-1, keepdim=True)
    return torch.where(total > 0, values / total.clamp_min(1e-30), torch.full_like(values, 1 / values.shape[-1]))


def check_well_formed(sel: Selection, scores: Scores, sink: int, recent: int) -> torch.Tensor:
    """Sorted, unique, in-range long indices with every protected token; returns the mask."""
    n = scores.num_tokens
    assert sel.num_tokens == n and sel.layer_indices == scores.layer_indices
    assert len(sel.indices) == scores.num_layers
    for heads in sel.indices:
        assert len(heads) == scores.num_kv_heads
        for idx in heads:
            assert idx.dtype == torch.long and idx.dim() == 1
            assert bool((idx[1:] > idx[:-1]).all())
            assert len(idx) == 0 or (0 <= int(idx[0]) and int(idx[-1]) < n)
    mask = sel.mask()
    assert bool(mask[:, :, protected(n, sink, recent)].all())
    return mask


def check_head_top_k(mask: torch.Tensor, values: torch.Tensor, sink: int, recent: int) -> None:
    """In every head, each kept unprotected score >= each dropped score."""
    free = ~protected(values.shape[-1], sink, recent)
    for keep, v in zip(mask.flatten(0, 1), values.flatten(0, 1), strict=True):
        kept, dropped = v[keep & free], v[~keep]
        if len(kept) and len(dropped):
            assert kept.min() >= dropped.max()


@fast
@given(case=cases())
def test_uniform_keeps_the_top_budget_per_head(case):
    scores, budget, sink, recent = case
    sel = UniformPolicy(UniformConfig(budget=budget, sink=sink, recent=recent)).select(scores)
    mask = check_well_formed(sel, scores, sink, recent)
    assert bool((sel.counts() == min(budget, scores.num_tokens)).all())
    check_head_top_k(mask, scores.values, sink, recent)


@fast
@given(
    n=st.integers(1, 8),
    sink=st.integers(0, 2),
    recent=st.integers(0, 2),
    seed=st.integers(0, 2**31 - 1),
    budget=st.integers(1, 8),
)
def test_uniform_matches_brute_force(n, sink, recent, budget, seed):
    assume(budget >= min(sink + recent, n) and budget < n)
    values = torch.rand(1, 1, n, generator=torch.Generator().manual_seed(seed))
    kept = UniformPolicy(UniformConfig(budget=budget, sink=sink, recent=recent)).select(Scores(values, (0,)))
    must = set(protected(n, sink, recent).nonzero().flatten().tolist())
    best = max(
        sum(values[0, 0, j].item() for j in combo)
        for combo in itertools.combinations(range(n), budget)
        if must <= set(combo)
    )
    assert values[0, 0, kept.indices[0][0]].sum().item() == pytest.approx(best)


@fast
@given(case=cases(), beta=st.floats(1.01, 40))
def test_pyramid_budgets_are_exact_and_non_increasing(case, beta):
    scores, budget, sink, recent = case
    l, n = scores.num_layers, scores.num_tokens
    policy = PerLayerPolicy(PerLayerConfig(budget=budget, sink=sink, recent=recent, beta=beta))
    p = min(sink + recent, n)
    budgets = [n] * l if budget >= n else [p + b for b in pyramid_budgets(l, budget - p, beta, n - p, prompt_tokens=n)]
    assert sum(budgets) == min(l * budget, l * n)
    assert all(a >= b for a, b in zip(budgets, budgets[1:], strict=False))
    assert all(p <= b <= n for b in budgets), "every layer keeps the protected tokens"
    sel = policy.select(scores)
    mask = check_well_formed(sel, scores, sink, recent)
    assert sel.counts().tolist() == [[b] * scores.num_kv_heads for b in budgets]
    check_head_top_k(mask, scores.values, sink, recent)


@fast
@given(case=cases(), floor_frac=st.floats(0, 1))
def test_adaptive_budgets_are_exact_and_floored(case, floor_frac):
    scores, budget, sink, recent = case
    l, n = scores.num_layers, scores.num_tokens
    policy = PerLayerPolicy(
        PerLayerConfig(budget=budget, sink=sink, recent=recent, schedule="adaptive", floor_frac=floor_frac)
    )
    budgets = policy.layer_budgets(scores)
    assert sum(budgets) == min(l * budget, l * n)
    assert all(b <= n for b in budgets)
    if budget < n:
        assert min(budgets) >= max(math.ceil(round(floor_frac * budget, 9)), min(sink + recent, n))
    sel = policy.select(scores)
    mask = check_well_formed(sel, scores, sink, recent)
    assert sel.counts().tolist() == [[b] * scores.num_kv_heads for b in budgets]
    check_head_top_k(mask, scores.values, sink, recent)


@fast
@given(
    g=st.integers(1, 3),
    n=st.integers(4, 24),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
    floor_frac=st.floats(0, 1),
    concentrated_first=st.booleans(),
)
def test_adaptive_gives_spread_layers_no_less_than_concentrated_ones(g, n, seed, data, floor_frac, concentrated_first):
    budget = data.draw(st.integers(1, n - 1))
    c = data.draw(st.integers(1, budget))
    gen = torch.Generator().manual_seed(seed)
    spread = 1 + torch.rand(g, n, generator=gen)
    concentrated = torch.zeros(g, n)
    for head in range(g):
        concentrated[head, torch.randperm(n, generator=gen)[:c]] = torch.rand(c, generator=gen) + 0.5
    layers = [concentrated, spread] if concentrated_first else [spread, concentrated]
    policy = PerLayerPolicy(PerLayerConfig(budget=budget, schedule="adaptive", floor_frac=floor_frac))
    budgets = policy.layer_budgets(Scores(torch.stack(layers), (0, 1)))
    b_conc, b_spread = budgets if concentrated_first else budgets[::-1]
    assert b_conc <= b_spread


def test_adaptive_by_hand():
    one_hot = torch.zeros(1, 10)
    one_hot[0, 3] = 5.0
    scores = Scores(torch.stack([one_hot, torch.ones(1, 10)]), (0, 1))
    policy = PerLayerPolicy(PerLayerConfig(budget=4, schedule="adaptive", floor_frac=0.2))
    assert policy.layer_budgets(scores) == [1, 7]
    assert policy.select(scores).indices[0][0].tolist() == [3]
    policy = PerLayerPolicy(PerLayerConfig(budget=4, schedule="adaptive", floor_frac=0.5))
    assert policy.layer_budgets(scores) == [2, 6]


def test_adaptive_by_hand_with_gqa_and_head_scales():
    """G = 2 with heads on scales 1e3 and 1e-3: shares are counted after per-head normalisation, over G."""
    scores = Scores(
        torch.tensor(
            [
                [[1000.0, 0.0, 0.0, 0.0], [0.001, 0.001, 0.001, 0.001]],
                [[0.5, 0.5, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0]],
            ]
        ),
        (0, 1),
    )
    # Normalised: l0 = [1,0,0,0] and [.25]*4; l1 = [.5,.5,0,0] and [.75,.25,0,0]. The top
    # L*G*B = 8 entries are 5 of layer 0 and 3 of layer 1: shares 5/2 and 3/2.
    # floor_frac 0.5: f = 1, quotas 1 + 2 * (1.5, 0.5) / 2 = (2.5, 1.5) -> [3, 1].
    policy = PerLayerPolicy(PerLayerConfig(budget=2, schedule="adaptive", floor_frac=0.5))
    assert policy.layer_budgets(scores) == [3, 1]
    kept = policy.select(scores).indices
    assert [h.tolist() for h in kept[0]] == [[0, 1, 2], [0, 1, 2]]
    assert [h.tolist() for h in kept[1]] == [[0], [0]]
    policy = PerLayerPolicy(PerLayerConfig(budget=2, schedule="adaptive", floor_frac=0.0))
    assert policy.layer_budgets(scores) == [3, 1]


def adaptive_brute_force(values: torch.Tensor, budget: int, floor_frac: float, sink: int, recent: int) -> list[int]:
    """The adaptive schedule as its docstring defines it, written out with Python loops."""
    layers, heads, n = values.shape
    entries = []
    for l, g in itertools.product(range(layers), range(heads)):
        row = values[l, g].float()
        total = float(row.sum())
        for j in range(n):
            share = float(row[j] / row.sum()) if total > 0 else 1.0 / n
            if j < sink or j >= n - recent:
                share = math.inf
            entries.append((-share, l, g, j))
    entries.sort()
    counts = [0] * layers
    for _, l, _, _ in entries[: layers * heads * budget]:
        counts[l] += 1
    floor = max(math.ceil(round(floor_frac * budget, 9)), min(sink + recent, n))
    excess = [max(Fraction(c, heads) - floor, Fraction(0)) for c in counts]
    total = sum(excess, Fraction(0))
    quotas = [Fraction(floor) + layers * (budget - floor) * e / total if total else Fraction(floor) for e in excess]
    out = [math.floor(q) for q in quotas]
    for i in sorted(range(layers), key=lambda i: (out[i] - quotas[i], i))[: layers * budget - sum(out)]:
        out[i] += 1
    while max(out) > n:
        spill = sum(max(b - n, 0) for b in out)
        out = [min(b, n) for b in out]
        below = [i for i, b in enumerate(out) if b < n]
        for rank, i in enumerate(below):
            out[i] += spill // len(below) + (rank < spill % len(below))
    return out


@fast
@given(case=cases(), floor_frac=st.floats(0, 1))
def test_adaptive_budgets_equal_brute_force(case, floor_frac):
    scores, budget, sink, recent = case
    assume(budget < scores.num_tokens)
    policy = PerLayerPolicy(
        PerLayerConfig(budget=budget, sink=sink, recent=recent, schedule="adaptive", floor_frac=floor_frac)
    )
    expected = adaptive_brute_force(scores.values, budget, floor_frac, sink, recent)
    floor = max(math.ceil(round(floor_frac * budget, 9)), min(sink + recent, scores.num_tokens))
    if min(expected) < min(sink + recent, scores.num_tokens):
        with pytest.raises(ValueError, match="budget"):
            policy.layer_budgets(scores)
        return
    assert policy.layer_budgets(scores) == expected
    assert min(expected) >= min(floor, scores.num_tokens)


def test_pyramid_by_hand():
    assert pyramid_budgets(4, 5, 20.0, 100) == [10, 7, 3, 0]
    assert pyramid_budgets(4, 5, 20.0, 9) == [5, 5, 5, 5], "prompt < 2B: SnapKV in every layer"
    assert pyramid_budgets(4, 5, 20.0, 10) == [10, 7, 3, 0]
    assert pyramid_budgets(1, 5, 20.0, 100) == [5]
    assert pyramid_budgets(3, 6, 2.0, 100) == [9, 6, 3]
    # b_max clipped to n' = 7 (of a 12-token prompt): b_min = 2 * 5 - 7 = 3.
    assert pyramid_budgets(3, 5, 20.0, 7, prompt_tokens=12) == [7, 5, 3]
    # PyramidKV's integers: b_min = 32 // 20 = 1, b_max = 63, step = 62 // 29 = 2.
    reference = pyramid_budgets(30, 32, 20.0, 1000, rounding="reference")
    assert reference[:3] == [63, 61, 59] and reference[-1] == 5 and sum(reference) == 1020 > 30 * 32
    exact = pyramid_budgets(30, 32, 20.0, 1000)
    assert sum(exact) == 960 and exact[0] in (62, 63) and exact[-1] in (1, 2)  # 62.4 ... 1.6


def test_pyramid_keeps_the_protected_window_in_every_layer_and_spreads_the_rest():
    """PyramidKV (L = 30, B = 64, w = 32): the top layer keeps the window and (B - w) / beta scored tokens."""
    scores = Scores(torch.rand(30, 1, 2000, generator=torch.Generator().manual_seed(0)), tuple(range(30)))
    policy = PerLayerPolicy(PerLayerConfig(budget=64, recent=32, beta=20.0))
    budgets = policy.layer_budgets(scores)
    assert budgets[0] - 32 in (62, 63) and budgets[-1] - 32 in (1, 2) and sum(budgets) == 30 * 64
    tail = Scores(scores.values, scores.layer_indices, tail=1)
    # Query-aware: the re-fed last token is the window's last, 31 candidates are protected and
    # B' = 64 - 31 scored: PyramidKV at capacity B + 1 (the re-fed token is kept on top of B).
    expected = [31 + b for b in pyramid_budgets(30, 33, 20.0, 2000 - 31, prompt_tokens=2001)]
    assert policy.layer_budgets(tail) == expected
    kept = policy.select(tail).mask()
    assert bool(kept[:, :, -31:].all()) and not bool(kept[:, :, -32].all())


@fast
@given(case=cases(), alpha=st.floats(0, 1), normalize=st.booleans())
def test_per_head_budgets_and_floors(case, alpha, normalize):
    scores, budget, sink, recent = case
    l, g, n = scores.values.shape
    policy = PerHeadPolicy(PerHeadConfig(budget=budget, sink=sink, recent=recent, alpha=alpha, normalize=normalize))
    sel = policy.select(scores)
    mask = check_well_formed(sel, scores, sink, recent)
    counts = sel.counts()
    assert counts.sum(dim=1).tolist() == [g * min(budget, n)] * l
    p = min(sink + recent, n)
    floor = p + math.floor(round(alpha * (budget - p), 9))
    assert policy.head_floor(scores) == floor
    assert bool((counts >= min(floor, n)).all()) and bool((counts <= n).all())
    check_head_top_k(mask, scores.values, sink, recent)
    key = normalised(scores.values) if normalize else scores.values
    for layer in range(l):
        dropped = key[layer][~mask[layer]]
        if len(dropped) == 0:
            continue
        for head in range(g):
            if counts[layer, head] > floor:
                extra = key[layer, head][mask[layer, head] & ~protected(n, sink, recent)]
                assert extra.min() >= dropped.max()


@fast
@given(
    g=st.integers(1, 3),
    n=st.integers(3, 4),
    sink=st.integers(0, 1),
    recent=st.integers(0, 1),
    alpha=st.floats(0, 1),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_per_head_matches_brute_force(g, n, sink, recent, alpha, seed, data):
    budget = data.draw(st.integers(max(1, min(sink + recent, n)), n - 1))
    values = torch.rand(1, g, n, generator=torch.Generator().manual_seed(seed))
    policy = PerHeadPolicy(PerHeadConfig(budget=budget, sink=sink, recent=recent, alpha=alpha))
    mask = policy.select(Scores(values, (0,))).mask()[0]
    key, must, floor = normalised(values)[0], protected(n, sink, recent), policy.head_floor(Scores(values, (0,)))
    best = -1.0
    for bits in itertools.product([False, True], repeat=g * n):
        keep = torch.tensor(bits).view(g, n)
        if keep.sum() == g * budget and bool(keep[:, must].all()) and bool((keep.sum(1) >= floor).all()):
            best = max(best, key[keep & ~must].sum().item())
    assert key[mask & ~must].sum().item() == pytest.approx(best, abs=1e-6)


@fast
@given(
    case=cases(),
    name=st.sampled_from(["uniform", "per_layer", "per_head"]),
    schedule=st.sampled_from(["pyramid", "adaptive"]),
)
def test_budget_at_least_n_is_the_identity(case, name, schedule):
    scores, _, sink, recent = case
    spec = {"name": name, "budget": scores.num_tokens + 2, "sink": sink, "recent": recent}
    if name == "per_layer":
        spec["schedule"] = schedule
    sel = POLICIES.build(spec).select(scores)
    assert bool(sel.mask().all())
    assert all(torch.equal(idx, torch.arange(scores.num_tokens)) for heads in sel.indices for idx in heads)


def test_ties_go_to_the_lower_index():
    scores = Scores(torch.ones(2, 2, 6), (0, 1))
    for spec in ({"name": "uniform"}, {"name": "per_layer"}, {"name": "per_head"}):
        sel = POLICIES.build({**spec, "budget": 3}).select(scores)
        assert sel.indices[1][1].tolist() == list(range(len(sel.indices[1][1])))


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ({"name": "uniform", "budget": 0}, "budget"),
        ({"name": "uniform", "budget": -4}, "budget"),
        ({"name": "uniform", "budget": 4, "sink": -1}, "sink"),
        ({"name": "uniform", "budget": 4, "recent": -1}, "recent"),
        ({"name": "per_head", "budget": 4, "alpha": -0.1}, "alpha"),
        ({"name": "per_head", "budget": 4, "alpha": 1.5}, "alpha"),
        ({"name": "per_layer", "budget": 4, "beta": 1.0}, "beta"),
        ({"name": "per_layer", "budget": 4, "beta": 0.5}, "beta"),
        ({"name": "per_layer", "budget": 4, "floor_frac": -0.1}, "floor_frac"),
        ({"name": "per_layer", "budget": 4, "floor_frac": 1.01}, "floor_frac"),
        ({"name": "per_layer", "budget": 4, "schedule": "linear"}, "schedule"),
        ({"name": "per_head", "budget": 4, "beta": 2.0}, "beta"),
    ],
)
def test_invalid_config_raises(spec, param):
    with pytest.raises(ValueError, match=param):
        POLICIES.build(spec)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "uniform", "budget": 3, "sink": 2, "recent": 2},
        {"name": "per_head", "budget": 3, "sink": 2, "recent": 2},
        {"name": "per_layer", "budget": 3, "sink": 2, "recent": 2},
        {"name": "per_layer", "budget": 3, "sink": 2, "recent": 2, "schedule": "adaptive"},
    ],
)
def test_budget_below_protected_count_raises(spec):
    scores = Scores(torch.rand(4, 2, 50), (0, 1, 2, 3))
    with pytest.raises(ValueError, match=r"budget.*sink.*recent"):
        POLICIES.build(spec).select(scores)
    short = Scores(torch.rand(4, 2, spec["budget"]), (0, 1, 2, 3))
    assert bool(POLICIES.build(spec).select(short).mask().all())


def test_a_steep_pyramid_still_keeps_the_protected_tokens_in_every_layer():
    scores = Scores(torch.rand(4, 2, 50), (0, 1, 2, 3))
    policy = POLICIES.build({"name": "per_layer", "budget": 8, "sink": 2, "recent": 2, "beta": 20})
    mask = policy.select(scores).mask()
    assert bool(mask[:, :, :2].all()) and bool(mask[:, :, -2:].all())
    assert mask.sum(dim=-1)[:, 0].tolist() == policy.layer_budgets(scores) and sum(policy.layer_budgets(scores)) == 32


@pytest.mark.parametrize("name", ["uniform", "per_layer", "per_head"])
def test_bad_scores_raise(name):
    policy = POLICIES.build({"name": name, "budget": 2})
    with pytest.raises(ValueError, match="finite"):
        policy.select(Scores(torch.tensor([[[1.0, float("nan"), 0.5]]]), (0,)))
    if name == "per_head":
        with pytest.raises(ValueError, match="non-negative"):
            policy.select(Scores(torch.tensor([[[1.0, -1.0, 0.5]]]), (0,)))


def test_registry_round_trip():
    policy = POLICIES.build({"name": "per_head", "budget": 8, "alpha": 0.5})
    assert isinstance(policy, PerHeadPolicy)
    dumped = policy.config.model_dump()
    assert dumped == {"name": "per_head", "budget": 8, "sink": 0, "recent": 0, "alpha": 0.5, "normalize": True}
    assert POLICIES.parse(dumped) == policy.config
    scores = Scores(torch.rand(2, 3, 20), (0, 1))
    assert POLICIES.build(dumped).select(scores).mask().equal(policy.select(scores).mask())
    layer = POLICIES.build({"name": "per_layer", "budget": 8, "schedule": "adaptive"}).config.model_dump()
    assert layer == {
        "name": "per_layer",
        "budget": 8,
        "sink": 0,
        "recent": 0,
        "schedule": "adaptive",
        "beta": 20.0,
        "rounding": "exact",
        "floor_frac": 0.2,
    }


def test_largest_remainder_keeps_the_sum():
    assert largest_remainder([Fraction(5, 2), Fraction(5, 2), Fraction(1)], 6) == [3, 2, 1]
    with pytest.raises(ValueError):
        largest_remainder([Fraction(1), Fraction(1)], 5)


def test_a_head_whose_scores_sum_to_zero_competes_as_uniform():
    """normalize=True: an all-zero head counts as uniform 1/n, so its tokens beat a peaked head's
    near-zero tail in the layer-wide top-k."""
    values = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [1.0, 1e-6, 1e-6, 1e-6]]])
    policy = PerHeadPolicy(PerHeadConfig(budget=2, alpha=0.0, normalize=True))
    kept = policy.select(Scores(values, (0,))).indices[0]
    assert [h.tolist() for h in kept] == [[0, 1, 2], [0]]


# ---------------------------------------------------------------------------------------------
# global: one threshold across every layer and KV head


@fast
@given(case=cases(), alpha=st.floats(0, 1), normalize=st.booleans())
def test_global_total_is_exact_floors_hold_and_kept_beat_dropped_everywhere(case, alpha, normalize):
    scores, budget, sink, recent = case
    l, g, n = scores.values.shape
    policy = GlobalPolicy(GlobalConfig(budget=budget, sink=sink, recent=recent, alpha=alpha, normalize=normalize))
    sel = policy.select(scores)
    mask = check_well_formed(sel, scores, sink, recent)
    counts = sel.counts()
    assert int(counts.sum()) == l * g * min(budget, n)
    p = min(sink + recent, n)
    floor = p + math.floor(round(alpha * (budget - p), 9))
    assert bool((counts >= min(floor, n)).all()) and bool((counts <= n).all())
    if budget >= n:
        return
    key = normalised(scores.values) if normalize else scores.values
    free = ~protected(n, sink, recent)
    dropped = key[~mask]
    if len(dropped):  # every token kept above a head's floor beats every dropped one, anywhere
        for layer in range(l):
            for head in range(g):
                if counts[layer, head] > floor:
                    ranked = key[layer, head][free].sort(descending=True).values
                    above = ranked[: int(counts[layer, head]) - p][max(floor - p, 0) :]
                    assert above.min() >= dropped.max()


def test_global_a_layer_that_matters_takes_the_budget_of_one_that_does_not() -> None:
    values = torch.cat([torch.full((1, 2, 10), 1e-3), torch.rand(1, 2, 10, generator=torch.Generator().manual_seed(0))])
    sel = POLICIES.build({"name": "global", "budget": 4}).select(Scores(values, (0, 1)))
    assert sel.counts().tolist() == [[0, 0], [8, 8]]
    floored = POLICIES.build({"name": "global", "budget": 4, "alpha": 0.5}).select(Scores(values, (0, 1)))
    counts = floored.counts()
    assert counts[0].tolist() == [2, 2] and int(counts[1].sum()) == 12 and int(counts[1].min()) >= 2


def test_global_ties_go_to_the_lower_layer_head_and_token() -> None:
    sel = POLICIES.build({"name": "global", "budget": 3}).select(Scores(torch.ones(2, 2, 6), (0, 1)))
    assert sel.counts().tolist() == [[6, 6], [0, 0]]


def test_global_budget_at_least_n_is_the_identity() -> None:
    sel = POLICIES.build({"name": "global", "budget": 9}).select(Scores(torch.rand(2, 3, 8), (0, 1)))
    assert bool(sel.mask().all())


@pytest.mark.parametrize(
    "spec,field", [({"alpha": 1.5}, "alpha"), ({"budget": 0}, "budget"), ({"normalize": 1}, "normalize")]
)
def test_global_bad_values_name_the_field(spec, field) -> None:
    with pytest.raises(ValueError, match=field):
        POLICIES.build({"name": "global", "budget": 4, **spec})


@fast
@given(case=cases(), quantile=st.floats(0, 1))
def test_threshold_keeps_the_protected_and_what_passes_within_its_cap(case, quantile):
    """Protected kept; every other kept score passes log U >= tau; at most L * G * min(B, n) in all;
    a passing score left out is no higher than any kept unprotected one (the cap's one ranking);
    and under the cap nothing that passes is left out."""
    scores, budget, sink, recent = case
    values = scores.values
    tau = math.log(max(float(torch.quantile(values.flatten(), quantile)), 1e-30))
    sel = ThresholdPolicy(ThresholdConfig(budget=budget, threshold=tau, sink=sink, recent=recent)).select(scores)
    mask = check_well_formed(sel, scores, sink, recent)
    layers, heads, n = values.shape
    free = ~protected(n, sink, recent).expand_as(mask)
    passing = values.log() >= tau
    assert bool((passing | ~free)[mask].all())
    assert int(mask.sum()) <= layers * heads * min(budget, n)
    left_out = passing & free & ~mask
    if bool(left_out.any()):
        assert int(mask.sum()) == layers * heads * min(budget, n)
        kept_free = values[mask & free]
        assert kept_free.numel() == 0 or float(values[left_out].max()) <= float(kept_free.min())


def test_threshold_refuses_a_non_finite_threshold_and_negative_scores():
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match="threshold must be a finite number"):
            ThresholdConfig(budget=4, threshold=bad)
    policy = ThresholdPolicy(ThresholdConfig(budget=4, threshold=-1.0))
    with pytest.raises(ValueError, match="non-negative"):
        policy.select(Scores(-torch.ones(1, 1, 5), (0,)))
