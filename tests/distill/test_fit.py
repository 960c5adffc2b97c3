"""The surrogate's fitting (KVzap's linear and MLP maps) against brute force, at its edges, and
its held-out figures against their definitions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lorekv.distill import SurrogateMap, fit_linear, fit_mlp, held_out_report
from lorekv.distill.fit import ranks, ridge


def pairs(n: int, layers: int, d: int, g: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, layers, d, generator=generator), torch.randn(n, layers, g, generator=generator)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), d=st.integers(1, 6), g=st.integers(1, 3), alpha=st.sampled_from([0.0, 0.1, 1.0, 30.0]))
def test_ridge_is_the_penalised_least_squares_solution(n, d, g, alpha) -> None:
    """Brute force: least squares on X and 1 augmented with sqrt(alpha) I rows (no row for the intercept)."""
    x, y = (t[:, 0].double() for t in pairs(n, 1, d, g, seed=n * 100 + d))
    if alpha == 0 and n <= d:
        return  # least squares has no unique solution
    weight, bias = ridge(x, y, alpha)
    design = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    penalty = torch.cat(
        [math.sqrt(alpha) * torch.eye(d, dtype=torch.float64), torch.zeros(d, 1, dtype=torch.float64)], 1
    )
    target = torch.cat([y, torch.zeros(d, g, dtype=torch.float64)])
    solution = torch.linalg.lstsq(torch.cat([design, penalty]), target).solution  # (d + 1, g)
    torch.testing.assert_close(weight, solution[:d].T, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(bias, solution[d], rtol=1e-8, atol=1e-8)


def test_a_linear_teacher_is_recovered_exactly_without_penalty() -> None:
    states = pairs(64, 2, 5, 2, seed=1)[0].double()
    true_weight = torch.randn(2, 2, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    offsets = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    scores = torch.einsum("lgd,nld->nlg", true_weight, states) + offsets
    surrogate = fit_linear(states, scores, [3, 7], alpha=0.0)
    assert surrogate.kind == "linear" and surrogate.layers == (3, 7)
    for i, layer in enumerate((3, 7)):
        torch.testing.assert_close(surrogate(layer, states[:, i]), scores[:, i], rtol=1e-9, atol=1e-9)
    report = held_out_report(surrogate, states, scores)
    assert report.tokens == 64 and [fit.layer for fit in report.layers] == [3, 7]
    assert report.mean("spearman") == pytest.approx(1.0) and report.mean("r2") == pytest.approx(1.0)
    assert report.mean("mse") == pytest.approx(0.0, abs=1e-12)


def test_the_penalty_shrinks_the_weights_and_the_intercept_stays_the_mean() -> None:
    states, scores = pairs(50, 1, 4, 1, seed=3)
    loose = fit_linear(states, scores, [0], alpha=0.0).maps[0]
    tight = fit_linear(states, scores, [0], alpha=1e9).maps[0]
    assert tight.weight.norm() < 1e-6 * loose.weight.norm() + 1e-9
    torch.testing.assert_close(tight.bias, scores[:, 0].mean(0), rtol=1e-5, atol=1e-6)


def test_the_mlp_fits_what_a_linear_map_cannot_and_the_same_seed_gives_the_same_map() -> None:
    """A target that is not linear in h (|h . w|): on held-out tokens the MLP's error is well below
    the linear map's, and refitting with the same seed gives the same weights."""
    states, _ = pairs(1200, 1, 4, 1, seed=4)
    direction = torch.tensor([1.0, -2.0, 0.5, 1.0])
    scores = (states @ direction).abs().unsqueeze(-1)
    train, test = slice(0, 1000), slice(1000, None)
    options = {"hidden_dim": 32, "epochs": 30, "lr": 1e-2, "batch_size": 100}
    mlp = fit_mlp(states[train], scores[train], [0], **options)
    linear = fit_linear(states[train], scores[train], [0])
    mlp_error = held_out_report(mlp, states[test], scores[test]).mean("mse")
    linear_error = held_out_report(linear, states[test], scores[test]).mean("mse")
    assert mlp.kind == "mlp" and mlp_error < 0.2 * linear_error, (mlp_error, linear_error)
    again = fit_mlp(states[train], scores[train], [0], **options)
    for a, b in zip(mlp.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_ranks_are_the_mean_ordinal_ranks_of_ties(values) -> None:
    column = torch.tensor(values, dtype=torch.float64).unsqueeze(1)
    expected = [sum(j for j, w in enumerate(sorted(values)) if w == v) / sorted(values).count(v) for v in values]
    assert ranks(column)[:, 0].tolist() == pytest.approx(expected)


def test_spearman_is_the_pearson_correlation_of_ranks_and_a_reversed_ranking_scores_minus_one() -> None:
    states, scores = pairs(30, 1, 3, 2, seed=5)
    surrogate = fit_linear(states, scores, [0])
    predicted = surrogate.all_layers(states).detach().double()[:, 0]
    report = held_out_report(surrogate, states, scores)
    expected = sum(
        torch.corrcoef(torch.stack([ranks(predicted)[:, g], ranks(scores[:, 0].double())[:, g]]))[0, 1].item()
        for g in range(2)
    )
    assert report.layers[0].spearman == pytest.approx(expected / 2)
    reversed_map = SurrogateMap([0], 3, 2)
    with torch.no_grad():
        reversed_map.maps[0].weight.copy_(-surrogate.maps[0].weight)
        reversed_map.maps[0].bias.zero_()
    flipped = held_out_report(reversed_map, states, surrogate.all_layers(states).detach())
    assert flipped.mean("spearman") == pytest.approx(-1.0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s, y: fit_linear(s, y[:, :1], [0, 1]), r"same N tokens and L layers"),
        (lambda s, y: fit_linear(s, y, [0]), r"states hold 2 layers, layers lists 1"),
        (lambda s, y: fit_linear(s, y, [0, 1], alpha=-1.0), r"alpha must be a finite number >= 0, got -1.0"),
        (lambda s, y: fit_linear(s, y.log(), [0, 1]), r"must be finite"),
        (lambda s, y: fit_mlp(s, y, [0, 1], hidden_dim=0), r"hidden_dim must be an integer >= 1, got 0"),
        (lambda s, y: fit_mlp(s, y, [0, 1], lr=float("nan")), r"lr must be a finite number >= 0"),
        (lambda s, y: fit_linear(s, y, [1, 1]), r"distinct layer indices"),
        (
            lambda s, y: fit_linear(s, y, [0, 1])(5, s[:, 0]),
            r"layer 5 has no fitted map; this surrogate maps layers \[0, 1\]",
        ),
    ],
)
def test_bad_input_is_refused_naming_it(call, match) -> None:
    states, scores = pairs(8, 2, 3, 2, seed=6)
    scores = scores - scores.min() - 1.0  # negative: their log is NaN
    with pytest.raises(ValueError, match=match):
        call(states, scores)
