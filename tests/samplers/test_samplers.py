"""Token rules and samplers: distributions, reproducibility, validation, registry round trips."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lorekv import token_rules
from lorekv.samplers import (
    SAMPLERS,
    GreedyConfig,
    GreedySampler,
    NucleusConfig,
    NucleusSampler,
    OracleConfig,
    OracleSampler,
    PromptWindowConfig,
    PromptWindowSampler,
    TemperatureConfig,
    TemperatureSampler,
)
from lorekv.token_rules import TokenRule
from lorekv.trajectories import LayerCapture, Trajectories

SETTINGS = settings(deadline=None, max_examples=50)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_logits(seed: int, m: int, v: int, scale: float) -> torch.Tensor:
    return torch.randn(m, v, generator=gen(seed)) * scale


logit_cases = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(1, 6),
    st.integers(1, 50),
    st.floats(0.1, 8.0),
)


def nucleus_members(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(M, V) bool: tokens that may be in the nucleus, computed in float64 with a rounding slack.

    Token i qualifies when the mass of the tokens strictly more likely than it is below top_p:
    every token of the smallest top-p set satisfies this (ties at the boundary make it a superset).
    """
    p = torch.softmax(logits.double() / temperature, dim=-1)
    above = p.unsqueeze(-2) > p.unsqueeze(-1) * (1 + 1e-5)
    mass_above = (above * p.unsqueeze(-2)).sum(-1)
    return mass_above < top_p + 1e-5


# ----------------------------------------------------------------------------- token rules


@SETTINGS
@given(case=logit_cases, temperature=st.floats(0.05, 5.0), seed=st.integers(0, 2**31 - 1))
def test_nucleus_top_p_one_equals_temperature(case: tuple[int, int, int, float], temperature: float, seed: int) -> None:
    logits = random_logits(*case)
    a = token_rules.temperature(logits, temperature, gen(seed))
    b = token_rules.nucleus(logits, temperature, 1.0, gen(seed))
    assert torch.equal(a, b)


@SETTINGS
@given(
    values=st.lists(st.lists(st.integers(-100, 100), min_size=2, max_size=30), min_size=1, max_size=5),
    winner=st.integers(0, 10**6),
    seed=st.integers(0, 2**31 - 1),
)
def test_temperature_to_zero_is_greedy(values: list[list[int]], winner: int, seed: int) -> None:
    v = min(len(row) for row in values)
    logits = torch.tensor([row[:v] for row in values], dtype=torch.float32) * 0.05
    k = winner % v
    logits[:, k] = logits.max(dim=-1).values + 0.05
    ids = token_rules.temperature(logits, 1e-4, gen(seed))
    assert torch.equal(ids, token_rules.greedy(logits))
    assert torch.equal(ids, torch.full_like(ids, k))


def test_greedy_is_argmax_lowest_index_on_ties() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -3.0, -0.5]])
    ids = token_rules.greedy(logits)
    assert ids.dtype == torch.long
    assert ids.tolist() == [1, 0, 3]


@SETTINGS
@given(case=logit_cases, temperature=st.floats(0.05, 5.0), top_p=st.floats(0.01, 1.0), seed=st.integers(0, 2**31 - 1))
def test_fixed_seed_reproduces(case: tuple[int, int, int, float], temperature: float, top_p: float, seed: int) -> None:
    logits = random_logits(*case)
    assert torch.equal(
        token_rules.temperature(logits, temperature, gen(seed)), token_rules.temperature(logits, temperature, gen(seed))
    )
    assert torch.equal(
        token_rules.nucleus(logits, temperature, top_p, gen(seed)),
        token_rules.nucleus(logits, temperature, top_p, gen(seed)),
    )


def test_different_seeds_draw_differently() -> None:
    logits = torch.zeros(64, 1000)
    draws = [token_rules.temperature(logits, 1.0, gen(seed)) for seed in range(8)]
    for i in range(len(draws)):
        for j in range(i + 1, len(draws)):
            assert (draws[i] != draws[j]).float().mean() > 0.9
    nucleus_draws = [token_rules.nucleus(logits, 1.0, 0.5, gen(seed)) for seed in range(2)]
    assert not torch.equal(*nucleus_draws)
    everything = torch.cat(draws)
    assert everything.unique().numel() > 350


@SETTINGS
@given(case=logit_cases, temperature=st.floats(0.05, 5.0), top_p=st.floats(1e-3, 1.0), seed=st.integers(0, 2**31 - 1))
def test_nucleus_stays_in_nucleus(
    case: tuple[int, int, int, float], temperature: float, top_p: float, seed: int
) -> None:
    logits = random_logits(*case)
    members = nucleus_members(logits, temperature, top_p)
    for draw in range(4):
        ids = token_rules.nucleus(logits, temperature, top_p, gen(seed + draw))
        assert ids.shape == (logits.shape[0],) and ids.dtype == torch.long
        assert members.gather(-1, ids.unsqueeze(-1)).all()


@SETTINGS
@given(case=logit_cases, temperature=st.floats(0.05, 5.0), seed=st.integers(0, 2**31 - 1))
def test_tiny_top_p_is_greedy(case: tuple[int, int, int, float], temperature: float, seed: int) -> None:
    logits = random_logits(*case)
    ids = token_rules.nucleus(logits, temperature, 1e-9, gen(seed))
    assert torch.equal(ids, token_rules.greedy(logits))


def test_nucleus_tiny_top_p_breaks_ties_like_greedy() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 2.0]]).expand(200, -1)
    ids = token_rules.nucleus(logits, 1.0, 0.1, gen(0))
    assert (ids == 1).all()


def test_nucleus_never_draws_masked_tokens() -> None:
    logits = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]]).expand(5000, -1)
    for top_p in (0.3, 0.99, 1.0):
        ids = token_rules.nucleus(logits, 1.0, top_p, gen(3))
        assert set(ids.unique().tolist()) <= {0, 2}


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_temperature_frequencies_match_softmax(temperature: float) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    n = 20_000
    ids = token_rules.temperature(logits.expand(n, -1), temperature, gen(1234))
    freq = torch.bincount(ids, minlength=5).double() / n
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    assert torch.allclose(freq, expected, atol=0.015), (freq, expected)


@pytest.mark.parametrize(("top_p", "nucleus"), [(0.45, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3])])
def test_nucleus_frequencies_match_renormalised_probs(top_p: float, nucleus: list[int]) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = probs.log().float().unsqueeze(0)
    n = 20_000
    ids = token_rules.nucleus(logits.expand(n, -1), 1.0, top_p, gen(99))
    freq = torch.bincount(ids, minlength=4).double() / n
    expected = torch.zeros(4, dtype=torch.float64)
    expected[nucleus] = probs[nucleus] / probs[nucleus].sum()
    assert torch.allclose(freq, expected, atol=0.015), (freq, expected)
    assert (freq[len(nucleus) :] == 0).all()


@pytest.mark.parametrize(("top_p", "size"), [(0.5, 1), (0.75, 2), (0.875, 3), (0.876, 4)])
def test_nucleus_is_smallest_set_reaching_top_p(top_p: float, size: int) -> None:
    """Dyadic probabilities are exact in float32, so a nucleus mass equal to top_p is tested as such."""
    logits = torch.tensor([[0.125, 0.5, 0.125, 0.25]]).log()
    ids = token_rules.nucleus(logits.expand(4000, -1), 1.0, top_p, gen(5))
    assert set(ids.unique().tolist()) == set([1, 3, 0, 2][:size])


# ----------------------------------------------------------------------------- stratified draws


@SETTINGS
@given(m=st.integers(1, 16), seed=st.integers(0, 2**31 - 1))
def test_stratified_uniforms_put_one_in_each_stratum(m: int, seed: int) -> None:
    u = token_rules.stratified_uniforms(m, gen(seed), torch.device("cpu"))
    assert u.shape == (m,) and bool(((u >= 0) & (u <= 1)).all())
    strata = (u.double() * m).floor().clamp(max=m - 1).long()
    assert sorted(strata.tolist()) == list(range(m))


def test_stratified_uniforms_deal_each_stratum_to_every_row_alike() -> None:
    """Marginally uniform: over 2,000 seeds each row lands in each of M = 4 strata about equally."""
    m, n = 4, 2000
    counts = torch.zeros(m, m)
    for seed in range(n):
        strata = (token_rules.stratified_uniforms(m, gen(seed), torch.device("cpu")) * m).long().clamp(max=m - 1)
        counts[torch.arange(m), strata] += 1
    assert ((counts / n - 1 / m).abs() < 0.04).all(), counts


def brute_inverse_cdf(probs: list[float], u: float) -> int:
    """The token whose slice of [0, total) holds u * total, tokens from most to least likely, ties by index."""
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    total, below = math.fsum(probs), 0.0
    for i in order:
        if probs[i] > 0 and below <= u * total < below + probs[i]:
            return i
        below += probs[i]
    return max((i for i in order if probs[i] > 0), key=order.index)  # u * total rounded to the top


@SETTINGS
@given(
    probs=st.lists(st.sampled_from([0.0, 0.0625, 0.125, 0.25, 0.5, 1.0]), min_size=1, max_size=12).filter(any),
    u=st.floats(0.0, 1.0, exclude_max=True),
)
def test_inverse_cdf_equals_brute_force(probs: list[float], u: float) -> None:
    """Dyadic probabilities sum exactly in float32, so the slice boundaries are exact."""
    got = token_rules.inverse_cdf(torch.tensor([probs]), torch.tensor([u]))
    assert got.tolist() == [brute_inverse_cdf(probs, float(torch.tensor(u, dtype=torch.float32)))]


def test_inverse_cdf_never_draws_a_zero_probability_token_at_the_top() -> None:
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]])
    top = torch.nextafter(torch.tensor([1.0]), torch.tensor([0.0]))
    for u in (top, torch.tensor([1.0]), torch.tensor([0.0])):
        assert token_rules.inverse_cdf(probs, u).item() in (1, 3)
    assert token_rules.inverse_cdf(probs, top).item() == 1  # the least likely token with mass


@SETTINGS
@given(case=logit_cases, m=st.integers(1, 12), temperature=st.floats(0.3, 3.0), seed=st.integers(0, 2**31 - 1))
def test_stratified_draws_cover_the_distribution(
    case: tuple[int, int, int, float], m: int, temperature: float, seed: int
) -> None:
    """M rows of one distribution: each token is drawn within one of M times its probability.

    A token's slice of [0, 1) of width p meets between floor(pM) - 1 and ceil(pM) + 1 of the M
    strata, one draw each; independent draws leave a likely token out or repeat an unlikely one.
    """
    logits = random_logits(*case)[:1].expand(m, -1)
    ids = token_rules.temperature(logits, temperature, gen(seed), "stratified")
    p = torch.softmax(logits[0].double() / temperature, dim=-1)
    counts = torch.bincount(ids, minlength=logits.shape[1]).double()
    tol = 1e-4  # float32 softmax and cumulative sum against float64
    assert bool((counts >= (p * m - tol).floor() - 1).all()) and bool((counts <= (p * m + tol).ceil() + 1).all())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stratified_draws_are_exact_draws_row_by_row(temperature: float) -> None:
    """Each row's token frequency over many seeds is the softmax, as for independent draws."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).expand(3, -1)
    n = 6000
    ids = torch.stack([token_rules.temperature(logits, temperature, gen(s), "stratified") for s in range(n)])
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    for row in range(3):
        freq = torch.bincount(ids[:, row], minlength=5).double() / n
        assert torch.allclose(freq, expected, atol=0.02), (row, freq, expected)


def test_stratified_nucleus_stays_in_the_nucleus() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(8, -1)
    for seed in range(50):
        assert set(token_rules.nucleus(logits, 1.0, 0.75, gen(seed), "stratified").tolist()) <= {0, 1}


def test_rules_reject_unknown_draws() -> None:
    logits = random_logits(0, 2, 5, 1.0)
    with pytest.raises(ValueError, match="draws"):
        token_rules.temperature(logits, 1.0, gen(0), "antithetic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draws"):
        token_rules.nucleus(logits, 1.0, 0.9, gen(0), "antithetic")  # type: ignore[arg-type]


def test_low_precision_logits_are_sampled_in_float32() -> None:
    logits = random_logits(5, 3, 40, 3.0)
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        assert torch.equal(token_rules.temperature(low, 0.8, gen(1)), token_rules.temperature(low.float(), 0.8, gen(1)))
        assert torch.equal(
            token_rules.nucleus(low, 0.8, 0.9, gen(1)), token_rules.nucleus(low.float(), 0.8, 0.9, gen(1))
        )


@SETTINGS
@given(case=logit_cases, seed=st.integers(0, 2**31 - 1))
def test_token_stats(case: tuple[int, int, int, float], seed: int) -> None:
    logits = random_logits(*case)
    m, v = logits.shape
    ids = torch.randint(0, v, (m,), generator=gen(seed))
    logprobs, entropies = token_rules.token_stats(logits, ids)
    assert logprobs.shape == entropies.shape == (m,)
    assert logprobs.dtype == entropies.dtype == torch.float32
    logp = torch.log_softmax(logits.double(), dim=-1)
    assert torch.allclose(logprobs.double(), logp[torch.arange(m), ids], atol=1e-5)
    assert torch.allclose(entropies.double(), -(logp.exp() * logp).sum(-1), atol=1e-5)
    assert (entropies >= 0).all() and (entropies <= math.log(v)).all()


def test_token_stats_extremes() -> None:
    inf = float("inf")
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -inf, -inf, -inf], [1.0, -inf, 1.0, 0.0]])
    logprobs, entropies = token_rules.token_stats(logits, torch.tensor([2, 0, 0]))
    assert torch.allclose(entropies[0], torch.tensor(math.log(4)))
    assert entropies[1] == 0 and logprobs[1] == 0
    assert torch.isfinite(entropies).all() and torch.isfinite(logprobs).all()
    assert torch.allclose(logprobs[0], torch.tensor(-math.log(4)))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_rules_reject_bad_temperature(bad: float) -> None:
    logits = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="temperature"):
        token_rules.temperature(logits, bad, gen(0))
    with pytest.raises(ValueError, match="temperature"):
        token_rules.nucleus(logits, bad, 0.9, gen(0))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_nucleus_rejects_bad_top_p(bad: float) -> None:
    with pytest.raises(ValueError, match="top_p"):
        token_rules.nucleus(torch.zeros(2, 3), 1.0, bad, gen(0))


@pytest.mark.parametrize("shape", [(3,), (2, 0), (1, 2, 3)])
def test_rules_reject_bad_logits(shape: tuple[int, ...]) -> None:
    logits = torch.zeros(shape)
    with pytest.raises(ValueError, match="logits"):
        token_rules.greedy(logits)
    with pytest.raises(ValueError, match="logits"):
        token_rules.temperature(logits, 1.0, gen(0))
    with pytest.raises(ValueError, match="logits"):
        token_rules.nucleus(logits, 1.0, 0.9, gen(0))
    with pytest.raises(ValueError, match="logits"):
        token_rules.token_stats(logits, torch.zeros(1, dtype=torch.long))


def test_token_stats_rejects_bad_ids() -> None:
    logits = torch.zeros(2, 3)
    for ids in (torch.tensor([0, 3]), torch.tensor([-1, 0]), torch.tensor([0]), torch.tensor([0.0, 1.0])):
        with pytest.raises(ValueError, match="token_ids"):
            token_rules.token_stats(logits, ids)


# ----------------------------------------------------------------------------- samplers


def tiny_trajectories(token_ids: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor, r: int) -> Trajectories:
    """A valid Trajectories with one tiny layer (H=2, G=1, n=5, d=4) around ``token_ids`` (M, T)."""
    m, t = token_ids.shape
    n, h, g, d = 5, 2, 1, 4
    positions = torch.arange(n - t, n) if r == 0 else torch.arange(n, n + t)
    layer = LayerCapture(
        layer_idx=0,
        queries=torch.randn(m, h, t, d),
        query_positions=positions,
        prompt_keys=torch.randn(g, n, d),
        prompt_values=torch.randn(g, n, d),
        response_keys=torch.randn(m, g, r, d),
        response_values=torch.randn(m, g, r, d),
        o_proj=torch.randn(8, h * d),
        scaling=d**-0.5,
    )
    return Trajectories(token_ids, logprobs, entropies, (layer,), prompt_length=n)


class FakeRollout:
    """Records calls; ``decode`` runs the rule on fixed pseudo-random logits per step."""

    vocab = 11

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.logits_seen: list[torch.Tensor] = []

    def decode(self, rule: TokenRule, num_futures: int, num_tokens: int) -> Trajectories:
        self.calls.append(("decode", num_futures, num_tokens))
        ids, logprobs, entropies = [], [], []
        for step in range(num_tokens):
            logits = random_logits(1000 + step, num_futures, self.vocab, 2.0)
            self.logits_seen.append(logits)
            chosen = rule(logits)
            assert chosen.shape == (num_futures,) and chosen.dtype == torch.long
            lp, ent = token_rules.token_stats(logits, chosen)
            ids.append(chosen), logprobs.append(lp), entropies.append(ent)
        stack = lambda xs: torch.stack(xs, dim=1)  # noqa: E731
        return tiny_trajectories(stack(ids), stack(logprobs), stack(entropies), r=num_tokens)

    def teacher_force(self, token_ids: torch.Tensor) -> Trajectories:
        self.calls.append(("teacher_force", token_ids.clone()))
        zeros = torch.zeros(token_ids.shape)
        return tiny_trajectories(token_ids, zeros, zeros, r=token_ids.shape[1])

    def prompt_window(self, window: int) -> Trajectories:
        self.calls.append(("prompt_window", window))
        t = min(window, 5)
        zeros = torch.zeros(1, t)
        return tiny_trajectories(torch.arange(5 - t, 5).unsqueeze(0), zeros, zeros, r=0)

    def generator(self, seed: int) -> torch.Generator:
        self.calls.append(("generator", seed))
        return gen(seed)


def test_greedy_sampler_decodes_one_argmax_future() -> None:
    rollout = FakeRollout()
    traj = GreedySampler(GreedyConfig(num_tokens=5)).sample(rollout)
    assert rollout.calls == [("decode", 1, 5)]
    assert traj.token_ids.shape == (1, 5)
    expected = torch.stack([token_rules.greedy(logits) for logits in rollout.logits_seen], dim=1)
    assert torch.equal(traj.token_ids, expected)
    assert GreedySampler(GreedyConfig()).prefill_window == 0
    assert GreedyConfig().num_futures == 1 and "num_futures" not in GreedyConfig().model_dump()


@pytest.mark.parametrize("kind", ["temperature", "nucleus"])
def test_sampled_futures_follow_config_and_seed(kind: str) -> None:
    spec = {"name": kind, "num_futures": 3, "num_tokens": 6, "temperature": 0.7, "seed": 42}
    first, second, other = FakeRollout(), FakeRollout(), FakeRollout()
    sampler = SAMPLERS.build(spec)
    a = sampler.sample(first)
    b = SAMPLERS.build(spec).sample(second)
    c = SAMPLERS.build({**spec, "seed": 43}).sample(other)
    assert first.calls == [("generator", 42), ("decode", 3, 6)]
    assert other.calls == [("generator", 43), ("decode", 3, 6)]
    assert a.token_ids.shape == (3, 6)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(a.token_ids, sampler.sample(FakeRollout()).token_ids)
    assert not torch.equal(a.token_ids, c.token_ids)


def test_sampler_rules_match_token_rules() -> None:
    cfg = {"num_futures": 2, "num_tokens": 4, "temperature": 1.3, "seed": 7}
    rollout = FakeRollout()
    traj = TemperatureSampler(TemperatureConfig(**cfg)).sample(rollout)
    g = gen(7)
    expected = torch.stack([token_rules.temperature(x, 1.3, g) for x in rollout.logits_seen], dim=1)
    assert torch.equal(traj.token_ids, expected)

    rollout = FakeRollout()
    traj = NucleusSampler(NucleusConfig(**cfg, top_p=0.6)).sample(rollout)
    g = gen(7)
    expected = torch.stack([token_rules.nucleus(x, 1.3, 0.6, g) for x in rollout.logits_seen], dim=1)
    assert torch.equal(traj.token_ids, expected)

    full = NucleusSampler(NucleusConfig(**cfg, top_p=1.0)).sample(FakeRollout())
    plain = TemperatureSampler(TemperatureConfig(**cfg)).sample(FakeRollout())
    assert torch.equal(full.token_ids, plain.token_ids)

    for draws in ("independent", "stratified"):
        full = NucleusSampler(NucleusConfig(**cfg, top_p=1.0, draws=draws)).sample(FakeRollout())
        rollout = FakeRollout()
        plain = TemperatureSampler(TemperatureConfig(**cfg, draws=draws)).sample(rollout)
        assert torch.equal(full.token_ids, plain.token_ids)
        g = gen(7)
        expected = torch.stack([token_rules.temperature(x, 1.3, g, draws) for x in rollout.logits_seen], dim=1)
        assert torch.equal(plain.token_ids, expected)
    assert TemperatureConfig().draws == "independent"


def test_prompt_window_sampler() -> None:
    sampler = PromptWindowSampler(PromptWindowConfig(window=3))
    assert sampler.prefill_window == 3
    rollout = FakeRollout()
    traj = sampler.sample(rollout)
    assert rollout.calls == [("prompt_window", 3)]
    assert traj.token_ids.shape == (1, 3)
    assert SAMPLERS.build("prompt_window").prefill_window == 32


def test_oracle_sampler_teacher_forces_its_tokens() -> None:
    ids = [[3, 1, 4, 1], [5, 9, 2, 6]]
    rollout = FakeRollout()
    traj = OracleSampler(OracleConfig(token_ids=ids)).sample(rollout)
    assert len(rollout.calls) == 1 and rollout.calls[0][0] == "teacher_force"
    forced = rollout.calls[0][1]
    assert forced.dtype == torch.long and forced.tolist() == ids
    assert traj.token_ids.tolist() == ids
    assert (OracleConfig(token_ids=ids).num_futures, OracleConfig(token_ids=ids).num_tokens) == (2, 4)
    assert "num_tokens" not in OracleConfig(token_ids=ids).model_dump()


def test_samplers_reject_short_rollouts() -> None:
    class ShortRollout(FakeRollout):
        def decode(self, rule: TokenRule, num_futures: int, num_tokens: int) -> Trajectories:
            return super().decode(rule, num_futures, num_tokens - 1)

    with pytest.raises(ValueError, match="rollout returned"):
        TemperatureSampler(TemperatureConfig(num_tokens=3)).sample(ShortRollout())


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "temperature", "temperature": 0.0}, "temperature"),
        ({"name": "temperature", "temperature": -1.0}, "temperature"),
        ({"name": "temperature", "temperature": float("inf")}, "temperature"),
        ({"name": "nucleus", "temperature": 0.0}, "temperature"),
        ({"name": "nucleus", "top_p": 0.0}, "top_p"),
        ({"name": "nucleus", "top_p": 1.5}, "top_p"),
        ({"name": "temperature", "num_futures": 0}, "num_futures"),
        ({"name": "nucleus", "num_futures": 0}, "num_futures"),
        ({"name": "temperature", "num_tokens": 0}, "num_tokens"),
        ({"name": "greedy", "num_tokens": 0}, "num_tokens"),
        ({"name": "greedy", "num_tokens": True}, "num_tokens"),
        ({"name": "temperature", "num_futures": 2.5}, "num_futures"),
        ({"name": "prompt_window", "window": 0}, "window"),
        ({"name": "oracle", "token_ids": [[1, 2], [3]]}, "token_ids"),
        ({"name": "oracle", "token_ids": []}, "token_ids"),
        ({"name": "oracle", "token_ids": [[]]}, "token_ids"),
        ({"name": "oracle", "token_ids": [[1, -1]]}, "token_ids"),
        ({"name": "oracle"}, "token_ids"),
        ({"name": "greedy", "num_futures": 2}, "num_futures"),
        ({"name": "temperature", "draws": "antithetic"}, "draws"),
        ({"name": "nucleus", "draws": 1}, "draws"),
    ],
)
def test_invalid_configs_name_the_parameter(spec: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SAMPLERS.build(spec)


def test_registry_round_trip_and_defaults() -> None:
    assert SAMPLERS.names() == [
        "adaptive", "greedy", "kvzip", "lookahead", "mixture", "nucleus", "oracle", "partial_kvzip", "prompt_window",
        "questions", "strided_kvzip", "temperature",
    ]  # fmt: skip
    sampler = SAMPLERS.build({"name": "nucleus", "top_p": 0.8})
    assert isinstance(sampler, NucleusSampler)
    assert sampler.config.top_p == 0.8
    assert (sampler.config.num_futures, sampler.config.num_tokens, sampler.config.temperature) == (4, 8, 1.0)
    temp = SAMPLERS.build("temperature").config
    assert (temp.num_futures, temp.num_tokens, temp.temperature, temp.seed) == (4, 8, 1.0, 0)
    assert SAMPLERS.build("greedy").config.num_tokens == 8
    assert NucleusConfig().top_p == 0.9
    configs = [
        GreedyConfig(num_tokens=3),
        TemperatureConfig(num_futures=2, temperature=0.5, seed=9),
        NucleusConfig(top_p=0.8),
        PromptWindowConfig(window=1),
        OracleConfig(token_ids=[[1, 2, 3]]),
    ]
    classes = [GreedySampler, TemperatureSampler, NucleusSampler, PromptWindowSampler, OracleSampler]
    for config, cls in zip(configs, classes, strict=True):
        rebuilt = SAMPLERS.parse(config.model_dump())
        assert rebuilt == config and type(rebuilt) is type(config)
        assert type(config).model_validate_json(config.model_dump_json()) == config
        assert isinstance(SAMPLERS.build(config), cls)


def test_registration_takes_the_name_from_the_config() -> None:
    from pydantic import Field

    from lorekv.registry import ComponentConfig, Registry

    class Named(ComponentConfig):
        name: str = "named"
        x: int = Field(default=1)

    class Nameless(ComponentConfig):
        pass

    registry: Registry[object] = Registry("thing")
    registry.register(Named)(lambda config: ("built", config.x))
    assert registry.names() == ["named"] and registry.build({"name": "named", "x": 3}) == ("built", 3)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Named)(object)
    with pytest.raises(TypeError, match="registry name"):
        registry.register(Nameless)


# ----------------------------------------------------------------------------- include_last_prompt_query

SPECS = [
    {"name": "greedy", "num_tokens": 3},
    {"name": "temperature", "num_futures": 2, "num_tokens": 3, "seed": 4},
    {"name": "nucleus", "num_futures": 2, "num_tokens": 3, "seed": 4},
    {"name": "oracle", "token_ids": [[1, 2, 3], [4, 5, 6]]},
]


@pytest.mark.parametrize("spec", SPECS, ids=[s["name"] for s in SPECS])
def test_last_prompt_query_off_by_default_changes_nothing(spec) -> None:
    sampler = SAMPLERS.build(spec)
    assert sampler.config.include_last_prompt_query is False and sampler.prefill_window == 0
    direct, through = FakeRollout(), FakeRollout()
    torch.manual_seed(0)
    a = sampler.sample(direct)
    torch.manual_seed(0)
    b = sampler.futures(through)
    assert direct.calls[0][0] == through.calls[0][0] and len(direct.calls) == len(through.calls)
    assert not any(call[0] == "prompt_window" for call in through.calls)
    assert torch.equal(a.layers[0].queries, b.layers[0].queries)


@pytest.mark.parametrize("spec", SPECS, ids=[s["name"] for s in SPECS])
def test_last_prompt_query_is_prepended_to_every_future(spec) -> None:
    sampler = SAMPLERS.build({**spec, "include_last_prompt_query": True})
    assert sampler.prefill_window == 1
    rollout = FakeRollout()
    futures = sampler.futures(rollout)
    assert rollout.calls[-1] == ("prompt_window", 1)
    m, t = futures.token_ids.shape
    layer = futures.layers[0]
    assert layer.queries.shape == (m, 2, 1 + t, 4)
    assert layer.query_positions.tolist() == [4, 5, 6, 7]
    assert layer.response_keys.shape[2] == t
    # every future's first query is the same one (the prompt's), then its own
    assert all(torch.equal(layer.queries[0, :, 0], layer.queries[i, :, 0]) for i in range(m))


def test_prompt_window_with_the_option_is_unchanged() -> None:
    off = PromptWindowSampler(PromptWindowConfig(window=3))
    on = PromptWindowSampler(PromptWindowConfig(window=3, include_last_prompt_query=True))
    assert on.prefill_window == off.prefill_window == 3
    rollout = FakeRollout()
    futures = on.futures(rollout)
    assert rollout.calls == [("prompt_window", 3)], "the window already holds n-1: no second capture"
    assert futures.layers[0].query_positions.tolist() == [2, 3, 4]


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_last_prompt_query_option_is_a_strict_bool(bad) -> None:
    with pytest.raises(ValueError, match="include_last_prompt_query"):
        SAMPLERS.build({"name": "greedy", "include_last_prompt_query": bad})
