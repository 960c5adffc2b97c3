"""Scorers: brute-force LOO, Gram form, attention mass, causality, equivariance, reductions, registry.

References are recomputed independently in float64 with per-head loops and explicit index
math (KV head g = h // group, W_o^h = o_proj[:, h*d:(h+1)*d]).

The scorers compute ||v_j - o||^2 (or its projected version) in float32 by the dot-product
expansion (absolute error ~ C eps32 d scale^2, scale = ||W|| (||v_j|| + ||o||), ||W|| = 1 for
plain LOO), except for each query's most attended token, whose distance is computed directly
(error ~ C eps32 d scale). With factor = a_j / (1 - a_j), comparisons of LOO scores use
    min(factor, 1) sqrt(C eps32 d) scale + factor C eps32 d scale + rtol |reference|,
rtol = 1e-4 + C eps32 / (1 - a_j) (rounding of a_j itself), and skip 1 - a_j < 1e-3 (the
saturated region has its own tests: dominant-token accuracy down to 1 - a_j = 1e-9, lone key).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import CaptureDims, layer_captures, make_capture, make_trajectories, trajectories

from lorekv.scorers import (
    SCORERS,
    AttentionMassConfig,
    AttentionMassScorer,
    LOOConfig,
    LOOScorer,
    ProjectedLOOConfig,
    ProjectedLOOScorer,
    Scorer,
    causal_attention,
)
from lorekv.scorers.loo import deletion_scores
from lorekv.scorers.projected_loo import gram_matrices, projected_sq_distances
from lorekv.trajectories import LayerCapture

SETTINGS = settings(deadline=None, max_examples=50)
EPS32 = torch.finfo(torch.float32).eps
SCORER_NAMES = ["attention_mass", "loo", "projected_loo"]
GUARD_MARGIN = 1e-3


# ---------------------------------------------------------------------------------------------
# independent float64 references


def key_visibility(layer: LayerCapture) -> torch.Tensor:
    """(T, n+R) bool, recomputed from positions: key s sits at position s."""
    num_keys = layer.prompt_length + layer.response_keys.shape[2]
    return torch.arange(num_keys)[None, :] <= layer.query_positions[:, None]


def reference_attention(layer: LayerCapture, drop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 weights (M, H, T, n+R) and outputs (M, H, T, d), optionally with key ``drop`` deleted.

    Each row is an explicit softmax, exp(l - max) / sum exp(l - max), over the keys the query
    sees (minus ``drop``); a query left with no key gets zero weights and output.
    """
    kv_of_head = torch.tensor([h // layer.group_size for h in range(layer.num_heads)])
    keys = layer.keys().double()[:, kv_of_head]  # (M, H, S, d)
    values = layer.values().double()[:, kv_of_head]
    visible = key_visibility(layer)
    if drop is not None:
        visible[:, drop] = False
    logits = (layer.queries.double() @ keys.transpose(-1, -2)) * layer.scaling  # (M, H, T, S)
    logits = torch.where(visible, logits, -torch.inf)
    peak = logits.amax(dim=-1, keepdim=True).clamp_min(-1e300)
    unnormalised = torch.where(visible, (logits - peak).exp(), 0.0)
    total = unnormalised.sum(dim=-1, keepdim=True)
    weights = torch.where(total > 0, unnormalised / total.clamp_min(1e-300), 0.0)
    return weights, weights @ values


def head_projection(layer: LayerCapture, h: int) -> torch.Tensor:
    """(D, d) float64 W_o^h = o_proj[:, h*d:(h+1)*d]."""
    d = layer.queries.shape[-1]
    return layer.o_proj.double()[:, h * d : (h + 1) * d]


def loo_tolerance(layer: LayerCapture, weights: torch.Tensor, outputs: torch.Tensor, projected: bool) -> torch.Tensor:
    """(M, H, T, n) float32 rounding bound of the LOO scores (see the module docstring).

    Tokens with a_j <= 1/2 use the expansion, error ~ sqrt(C eps32 d) * scale with a factor
    <= 1; the most attended token is computed directly, error ~ factor * C eps32 d * scale.
    """
    n, d = layer.prompt_length, layer.queries.shape[-1]
    a = weights[..., :n]
    factor = a / (1 - a).clamp_min(1e-12)
    v_norm = layer.prompt_values.double().norm(dim=-1)  # (G, n)
    v_norm = v_norm.repeat_interleave(layer.group_size, dim=0)  # (H, n)
    o_norm = outputs.norm(dim=-1, keepdim=True)  # (M, H, T, 1)
    scale = v_norm[None, :, None, :] + o_norm
    if projected:
        w_norm = torch.stack([head_projection(layer, h).norm() for h in range(layer.num_heads)])
        scale = scale * w_norm[None, :, None, None]
        d = max(d, layer.o_proj.shape[0])
    c = 64 * EPS32 * d
    return factor.clamp_max(1) * c**0.5 * scale + factor * c * scale + 1e-6


def check_against_brute_force(layer: LayerCapture, scores: torch.Tensor, projected: bool) -> None:
    """Compare (M, H, T, n) LOO scores with the deletion recomputed for every prompt token."""
    scores = scores.double()
    weights, outputs = reference_attention(layer)
    visible = key_visibility(layer)
    lone = visible.sum(dim=-1) == 1
    tol = loo_tolerance(layer, weights, outputs, projected)
    checked = 0
    for j in range(layer.prompt_length):
        _, deleted_outputs = reference_attention(layer, drop=j)
        change = outputs - deleted_outputs  # (M, H, T, d)
        if projected:
            change = torch.stack([change[:, h] @ head_projection(layer, h).T for h in range(layer.num_heads)], dim=1)
        reference = change.norm(dim=-1)  # (M, H, T)
        a = weights[..., j]
        got = scores[..., j]

        unseen = ~visible[:, j]
        assert torch.all(got[:, :, unseen] == 0), "a key the query cannot see must score 0"
        lone_seen = visible[:, j] & lone
        assert torch.all(got[:, :, lone_seen] == 0), "the only visible key scores 0 by definition"

        regular = (visible[:, j] & ~lone)[None, None, :] & (1 - a > GUARD_MARGIN)
        rtol = 1e-4 + 64 * EPS32 / (1 - a).clamp_min(GUARD_MARGIN)
        bound = tol[..., j] + rtol * reference
        err = (got - reference).abs()
        assert torch.all(err[regular] <= bound[regular]), (
            f"token {j}: max excess {(err - bound)[regular].max().item():.3g}"
        )
        checked += int(regular.sum())
        assert torch.all(torch.isfinite(got)) and torch.all(got >= 0)
    assert checked > 0 or bool(lone.all()) or bool((weights[..., : layer.prompt_length] > 1 - GUARD_MARGIN).any())


# ---------------------------------------------------------------------------------------------
# LOO and projected LOO against brute force


@SETTINGS
@given(layer=layer_captures())
def test_loo_equals_brute_force_deletion(layer: LayerCapture) -> None:
    scores = LOOScorer(LOOConfig()).query_scores(layer)
    check_against_brute_force(layer, scores, projected=False)


@SETTINGS
@given(layer=layer_captures())
def test_projected_loo_equals_brute_force_deletion(layer: LayerCapture) -> None:
    scores = ProjectedLOOScorer(ProjectedLOOConfig()).query_scores(layer)
    check_against_brute_force(layer, scores, projected=True)


def brute_force_deletion(layer: LayerCapture, projected: bool) -> torch.Tensor:
    """(M, H, T, n) float64 ||o - o_{-j}|| (through W_o^h when ``projected``), recomputed for every j."""
    _, outputs = reference_attention(layer)
    columns = []
    for j in range(layer.prompt_length):
        change = outputs - reference_attention(layer, drop=j)[1]
        if projected:
            change = torch.stack([change[:, h] @ head_projection(layer, h).T for h in range(layer.num_heads)], dim=1)
        columns.append(change.norm(dim=-1))
    return torch.stack(columns, dim=-1)


@SETTINGS
@given(layer=layer_captures(dtype=torch.float64), projected=st.booleans())
def test_float64_loo_equals_brute_force_to_a_tight_tolerance(layer: LayerCapture, projected: bool) -> None:
    """In float64 the scores equal the deletion recomputed from scratch to 1e-7 relative: an
    error of 0.1% anywhere fails. Lone keys score 0 by definition."""
    scorer = ProjectedLOOScorer(ProjectedLOOConfig()) if projected else LOOScorer(LOOConfig())
    scores = scorer.query_scores(layer)
    assert scores.dtype == torch.float64
    reference = brute_force_deletion(layer, projected)
    weights, _ = reference_attention(layer)
    visible = key_visibility(layer)
    lone = (visible.sum(dim=-1) == 1)[:, None].expand(-1, layer.prompt_length)
    reference = torch.where(lone, torch.zeros_like(reference), reference)
    assume(bool((weights[..., : layer.prompt_length] < 1 - 1e-5).all()))
    torch.testing.assert_close(scores, reference, rtol=1e-7, atol=1e-9)


@SETTINGS
@given(layer=layer_captures())
def test_gram_form_equals_explicit_projection(layer: LayerCapture) -> None:
    attention = causal_attention(layer)
    a = attention.prompt_weights.double()
    o = attention.output.double()
    v = layer.prompt_values.double()
    n, group = layer.prompt_length, layer.group_size
    lone = attention.lone_query

    gram = gram_matrices(layer.o_proj.float(), layer.num_heads).double()
    sq_gram = projected_sq_distances(layer.prompt_values.float(), attention.output, gram.float()).double()
    scores = ProjectedLOOScorer(ProjectedLOOConfig()).query_scores(layer).double()
    for h in range(layer.num_heads):
        w_h = head_projection(layer, h)
        torch.testing.assert_close(gram[h], w_h.T @ w_h, rtol=1e-5, atol=1e-5)
        diff = v[h // group][None, None, :, :] - o[:, h, :, None, :]  # (M, T, n, d)
        projected = diff @ w_h.T  # (M, T, n, D), explicitly
        explicit_sq = projected.pow(2).sum(-1)
        scale = (w_h.norm() * (v[h // group].norm(dim=-1)[None, None, :] + o[:, h].norm(dim=-1)[..., None])) ** 2
        assert torch.all((sq_gram[:, h] - explicit_sq).abs() <= 64 * EPS32 * layer.o_proj.shape[0] * scale + 1e-6)

        factor = a[:, h] / (1 - a[:, h]).clamp_min(1e-12)
        expected = torch.where(lone[None, :, None], 0.0, factor * explicit_sq.sqrt())
        tol = factor * (64 * EPS32 * layer.o_proj.shape[0] * scale).sqrt() + 1e-4 * expected + 1e-6
        unsaturated = (1 - a[:, h]) > 1e-3  # the dominant token's stable form has its own tests
        assert torch.all((scores[:, h] - expected).abs()[unsaturated] <= tol[unsaturated])
    assert scores.shape == (layer.num_futures, layer.num_heads, layer.queries.shape[2], n)


def test_lone_visible_key_scores_zero_and_mass_one() -> None:
    """Query at position 0 sees only prompt token 0: a_0 = 1, o = v_0; LOO scores are defined as 0."""
    dims = CaptureDims(futures=2, kv_heads=2, group=2, queries=4, prompt=4, response=0, head_dim=4, hidden=6)
    layer = make_capture(dims, seed=3)
    assert layer.query_positions.tolist() == [0, 1, 2, 3]
    mass = AttentionMassScorer(AttentionMassConfig()).query_scores(layer)
    assert torch.all(mass[:, :, 0, 0] == 1)
    assert torch.all(mass[:, :, 0, 1:] == 0)
    for scorer in (LOOScorer(LOOConfig()), ProjectedLOOScorer(ProjectedLOOConfig())):
        scores = scorer.query_scores(layer)
        assert torch.all(scores[:, :, 0, :] == 0)
        assert torch.all(scores[:, :, 1, :2] > 0)  # two visible keys: a real deletion cost


def peaked_capture(seed: int, target_gap: float) -> LayerCapture:
    """Queries all pointing at prompt key 2 (5 e_0), scaled so that max 1 - a_2 ~ ``target_gap``."""
    dims = CaptureDims(futures=2, kv_heads=2, group=2, queries=3, prompt=6, response=3, head_dim=4, hidden=5)
    layer = make_capture(dims, seed)
    e = torch.zeros(dims.head_dim)
    e[0] = 1
    keys = layer.prompt_keys.clone()
    keys[:, 2] = 5 * e
    layer = replace(layer, prompt_keys=keys)
    low, high = 0.0, 1e4
    for _ in range(60):
        mid = (low + high) / 2
        weights, _ = reference_attention(replace(layer, queries=(mid * e).expand_as(layer.queries).clone()))
        low, high = (mid, high) if (1 - weights[..., 2]).max() > target_gap else (low, mid)
    return replace(layer, queries=(high * e).expand_as(layer.queries).clone())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("target_gap", [1e-2, 1e-4, 1e-6, 1e-7, 1e-8, 1e-9])
@pytest.mark.parametrize("projected", [False, True])
def test_dominant_token_float32_matches_float64_deletion_at_saturation(
    seed: int, target_gap: float, projected: bool
) -> None:
    """An attention sink: 1 - a_j from 1e-2 down to 1e-9. The float32 score of the sink must equal
    the float64 deletion ||o - o_{-j}|| to a bounded relative error (the naive closed form
    a_j / (1 - a_j) ||v_j - o|| loses every digit here: 1e-9 is below float32's resolution of 1)."""
    layer = peaked_capture(seed, target_gap)
    weights, outputs = reference_attention(layer)
    _, deleted = reference_attention(layer, drop=2)
    change = outputs - deleted
    if projected:
        change = torch.stack([change[:, h] @ head_projection(layer, h).T for h in range(layer.num_heads)], dim=1)
    reference = change.norm(dim=-1)
    scorer = ProjectedLOOScorer(ProjectedLOOConfig()) if projected else LOOScorer(LOOConfig())
    got = scorer.query_scores(layer)[..., 2].double()
    gap = 1 - weights[..., 2]
    assert bool((gap < 2 * target_gap).all()) and bool((gap > 0).all())
    assert torch.all(reference > 0.1), "the sink's true score is large"
    relative = (got - reference).abs() / reference
    assert relative.max() < 1e-3, f"max relative error {relative.max():.3g} at 1 - a = {gap.min():.2g}"


@settings(deadline=None, max_examples=40)
@given(
    layer=layer_captures(kind="future"),
    log_gap=st.floats(-9, -2),
    projected=st.booleans(),
    sink=st.integers(0, 7),
)
def test_float32_scores_match_float64_brute_force_with_a_sink(
    layer: LayerCapture, log_gap: float, projected: bool, sink: int
) -> None:
    """Random captures with one prompt key turned into a sink of strength 1 - a ~ 10^log_gap: every
    float32 score of the sink stays within 1e-3 relative of the float64 brute-force deletion."""
    sink = sink % layer.prompt_length
    direction = layer.prompt_keys[:, sink] / layer.prompt_keys[:, sink].norm(dim=-1, keepdim=True)
    keys = layer.prompt_keys.clone()
    keys[:, sink] = direction * 4.0
    layer = replace(layer, prompt_keys=keys)
    kv_of_head = torch.arange(layer.num_heads) // layer.group_size
    base = direction[kv_of_head][None, :, None, :].expand_as(layer.queries)
    low, high = 0.0, 1e5
    for _ in range(80):
        mid = (low + high) / 2
        weights, _ = reference_attention(replace(layer, queries=(mid * base).clone()))
        low, high = (mid, high) if (1 - weights[..., sink]).max() > 10**log_gap else (low, mid)
    layer = replace(layer, queries=(high * base).clone())
    scorer = ProjectedLOOScorer(ProjectedLOOConfig()) if projected else LOOScorer(LOOConfig())
    got = scorer.query_scores(layer)[..., sink].double()
    weights, outputs = reference_attention(layer)
    change = outputs - reference_attention(layer, drop=sink)[1]
    if projected:
        change = torch.stack([change[:, h] @ head_projection(layer, h).T for h in range(layer.num_heads)], dim=1)
    reference = change.norm(dim=-1)
    checked = reference > 1e-3 * reference.max()
    relative = ((got - reference).abs() / reference.clamp_min(1e-30))[checked]
    assert relative.numel() > 0 and relative.max() < 1e-3


def test_lone_query_rows_are_zero_whatever_the_distance() -> None:
    """deletion_scores defines the score of a query's only visible key as 0, even if the
    squared distance it is handed is not (e.g. rounding in a reduced-precision matmul)."""
    dims = CaptureDims(futures=1, kv_heads=1, group=1, queries=3, prompt=3, response=0, head_dim=2, hidden=2)
    layer = make_capture(dims, seed=0)
    attention = causal_attention(layer)
    assert attention.lone_query.tolist() == [True, False, False]
    scores = deletion_scores(attention, torch.ones(1, 1, 3, 3), layer)
    assert torch.all(scores[:, :, 0] == 0)
    assert torch.all(scores[:, :, 1, :2] > 0)
    assert torch.all(scores[:, :, 1, 2] == 0)  # not visible: a = 0


@pytest.mark.parametrize("cls, config_cls", [(LOOScorer, LOOConfig), (ProjectedLOOScorer, ProjectedLOOConfig)])
def test_saturated_weight_gives_the_exact_deletion(cls: type[Scorer], config_cls: type) -> None:
    """A key so dominant that a_j rounds to 1 in float32 while other keys stay visible: the score
    is a_j ||v_j - o_{-j}||, finite and large, not 0 or inf."""
    dims = CaptureDims(futures=1, kv_heads=1, group=2, queries=2, prompt=5, response=2, head_dim=4, hidden=6)
    layer = make_capture(dims, seed=7)
    saturating = 200.0 * layer.prompt_keys[0, 2] / layer.prompt_keys[0, 2].norm()
    layer = replace(layer, queries=saturating.expand_as(layer.queries).clone())
    a = causal_attention(layer).prompt_weights
    assert torch.all(a[..., 2] == 1.0), "setup: the weight must saturate"
    scores = cls(config_cls()).query_scores(layer)
    assert torch.all(torch.isfinite(scores)) and torch.all(scores >= 0)
    weights, outputs = reference_attention(layer)
    change = outputs - reference_attention(layer, drop=2)[1]
    if cls is ProjectedLOOScorer:
        change = torch.stack([change[:, h] @ head_projection(layer, h).T for h in range(layer.num_heads)], dim=1)
    torch.testing.assert_close(scores[..., 2].double(), change.norm(dim=-1), rtol=1e-3, atol=0)


# ---------------------------------------------------------------------------------------------
# attention mass


@SETTINGS
@given(layer=layer_captures())
def test_attention_mass_matches_reference_and_normalises(layer: LayerCapture) -> None:
    n = layer.prompt_length
    weights, _ = reference_attention(layer)
    mass = AttentionMassScorer(AttentionMassConfig()).query_scores(layer)
    assert mass.dtype == torch.float32
    torch.testing.assert_close(mass.double(), weights[..., :n], rtol=1e-5, atol=1e-6)

    full = causal_attention(layer).weights
    torch.testing.assert_close(full.sum(-1), torch.ones_like(full.sum(-1)), rtol=0, atol=1e-5)
    prompt_sum = mass.sum(-1)  # (M, H, T)
    assert torch.all(prompt_sum <= 1 + 1e-5)
    sees_only_prompt = layer.query_positions < n
    torch.testing.assert_close(
        prompt_sum[..., sees_only_prompt], torch.ones_like(prompt_sum[..., sees_only_prompt]), rtol=0, atol=1e-5
    )
    if layer.response_keys.shape[2] == 0:
        assert bool(sees_only_prompt.all())


# ---------------------------------------------------------------------------------------------
# causality and permutation equivariance


def perturb_key(layer: LayerCapture, s: int, seed: int) -> LayerCapture:
    """Replace key/value ``s`` (prompt if s < n, else response s - n) with large random vectors."""
    gen = torch.Generator().manual_seed(seed)
    n = layer.prompt_length
    if s < n:
        keys, values = layer.prompt_keys.clone(), layer.prompt_values.clone()
        keys[:, s] = 10 * torch.randn(keys[:, s].shape, generator=gen)
        values[:, s] = 10 * torch.randn(values[:, s].shape, generator=gen)
        return replace(layer, prompt_keys=keys, prompt_values=values)
    keys, values = layer.response_keys.clone(), layer.response_values.clone()
    keys[:, :, s - n] = 10 * torch.randn(keys[:, :, s - n].shape, generator=gen)
    values[:, :, s - n] = 10 * torch.randn(values[:, :, s - n].shape, generator=gen)
    return replace(layer, response_keys=keys, response_values=values)


@SETTINGS
@given(layer=layer_captures(min_queries=2), data=st.data())
def test_invisible_keys_do_not_change_scores(layer: LayerCapture, data: st.DataObject) -> None:
    """Perturbing a key/value that some queries cannot see leaves their scores unchanged.

    Attention mass: to 1e-6 relative. The deletion scorers centre the values by the mean prompt
    value, which the perturbed value enters; the centre cancels exactly in exact arithmetic, so
    their float32 scores may move by rounding only: each stays within :func:`loo_tolerance` of
    the same exact score, so the two differ by at most twice that. A real leak of the 10x key
    moves them by O(1).
    """
    num_keys = layer.prompt_length + layer.response_keys.shape[2]
    first_position = int(layer.query_positions.min())
    s = data.draw(st.integers(first_position + 1, num_keys - 1), label="perturbed key")
    blind = layer.query_positions < s  # queries that cannot see key s
    assert bool(blind.any())
    changed = perturb_key(layer, s, seed=data.draw(st.integers(0, 1000)))
    weights, outputs = reference_attention(layer)
    for name in SCORER_NAMES:
        scorer = SCORERS.build(name)
        before, after = scorer.query_scores(layer), scorer.query_scores(changed)
        if name == "attention_mass":
            torch.testing.assert_close(after[:, :, blind], before[:, :, blind], rtol=1e-6, atol=1e-7)
            continue
        bound = 2 * loo_tolerance(layer, weights, outputs, projected=name == "projected_loo")[:, :, blind]
        err = (after[:, :, blind] - before[:, :, blind]).double().abs()
        assert torch.all(err <= bound), f"{name}: max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("name", SCORER_NAMES)
@pytest.mark.parametrize("kind_response", [0, 4])
def test_visible_key_change_does_change_scores(name: str, kind_response: int) -> None:
    """Positive control for the causality test: only the last query sees the perturbed key."""
    dims = CaptureDims(
        futures=2, kv_heads=2, group=2, queries=4, prompt=8, response=kind_response, head_dim=4, hidden=6
    )
    layer = make_capture(dims, seed=11)
    s = layer.prompt_length + layer.response_keys.shape[2] - 1
    changed = perturb_key(layer, s, seed=5)
    scorer = SCORERS.build(name)
    before, after = scorer.query_scores(layer), scorer.query_scores(changed)
    assert not torch.allclose(after[:, :, -1], before[:, :, -1], rtol=1e-3, atol=1e-4)
    if name == "attention_mass":
        torch.testing.assert_close(after[:, :, :-1], before[:, :, :-1], rtol=1e-6, atol=1e-7)
        return
    # The perturbed value enters the deletion scorers' centre (the mean prompt value) when it is
    # a prompt token: blind queries' scores then move by rounding only (see the test above).
    weights, outputs = reference_attention(layer)
    bound = 2 * loo_tolerance(layer, weights, outputs, projected=name == "projected_loo")[:, :, :-1]
    assert torch.all((after[:, :, :-1] - before[:, :, :-1]).double().abs() <= bound)


@SETTINGS
@given(layer=layer_captures(kind="future"), seed=st.integers(0, 10_000))
def test_prompt_permutation_equivariance(layer: LayerCapture, seed: int) -> None:
    """All queries sit after the prompt, so permuting prompt tokens permutes their scores."""
    n = layer.prompt_length
    assert bool((layer.query_positions >= n).all())
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    permuted = replace(layer, prompt_keys=layer.prompt_keys[:, perm], prompt_values=layer.prompt_values[:, perm])
    weights, outputs = reference_attention(layer)
    traj, traj_perm = make_trajectories((layer,)), make_trajectories((permuted,))
    for name, projected in (("attention_mass", None), ("loo", False), ("projected_loo", True)):
        scorer = SCORERS.build(name)
        original, moved = scorer.query_scores(layer)[..., perm].double(), scorer.query_scores(permuted).double()
        if projected is None:
            tol = torch.full_like(original, 1e-6) + 1e-5 * original
        else:
            a = weights[..., :n][..., perm]
            rtol = 1e-4 + 64 * EPS32 / (1 - a).clamp_min(EPS32)
            tol = 2 * loo_tolerance(layer, weights, outputs, projected)[..., perm] + rtol * original
        assert torch.all((moved - original).abs() <= tol)
        reduced_tol = reference_reduce(tol.float(), layer.num_kv_heads, "max", "max", 1)
        reduced, reduced_perm = scorer.score(traj)[:, 0], scorer.score(traj_perm)[:, 0]
        assert torch.all((reduced_perm - reduced[..., perm]).abs() <= reduced_tol)


# ---------------------------------------------------------------------------------------------
# reductions, pooling, output contract


def reference_reduce(
    query_scores: torch.Tensor, kv_heads: int, query_red: str, head_red: str, kernel: int, prefix: int | None = None
) -> torch.Tensor:
    """(M, H, T, n) -> (M, G, n) by loops: over T, over the heads h with h // group == g, then
    pooling of the first ``prefix`` tokens (default all) among themselves; the rest is not pooled."""
    m, h_count, _, n = query_scores.shape
    group = h_count // kv_heads
    per_head = query_scores.mean(2) if query_red == "mean" else query_scores.amax(2)
    out = torch.zeros(m, kv_heads, n)
    for g in range(kv_heads):
        members = torch.stack([per_head[:, h] for h in range(h_count) if h // group == g], dim=0)
        out[:, g] = members.mean(0) if head_red == "mean" else members.amax(0)
    prefix = n if prefix is None else prefix
    pooled = out.clone()
    half = kernel // 2
    for j in range(prefix):
        pooled[..., j] = out[..., max(0, j - half) : min(j + half + 1, prefix)].amax(-1)
    return pooled


@SETTINGS
@given(
    traj=trajectories(),
    name=st.sampled_from(SCORER_NAMES),
    query_red=st.sampled_from(["mean", "max"]),
    head_red=st.sampled_from(["mean", "max"]),
    kernel=st.sampled_from([1, 3, 5]),
)
def test_score_reductions_match_direct_computation(traj, name: str, query_red: str, head_red: str, kernel: int) -> None:
    scorer = SCORERS.build(
        {"name": name, "query_reduction": query_red, "head_reduction": head_red, "pool_kernel": kernel}
    )
    out = scorer.score(traj)
    kv_heads = traj.layers[0].num_kv_heads
    assert out.shape == (traj.num_futures, len(traj.layers), kv_heads, traj.prompt_length)
    assert out.dtype == torch.float32
    assert torch.all(out >= 0) and torch.all(torch.isfinite(out))
    for l, layer in enumerate(traj.layers):
        qs = scorer.query_scores(layer)
        assert qs.shape == (traj.num_futures, layer.num_heads, traj.num_tokens, traj.prompt_length)
        assert qs.dtype == torch.float32
        prefix = min(int(layer.query_positions.min()), traj.prompt_length)
        expected = reference_reduce(qs, kv_heads, query_red, head_red, kernel, prefix)
        torch.testing.assert_close(out[:, l], expected, rtol=1e-6, atol=1e-7)
        unpooled = reference_reduce(qs, kv_heads, query_red, head_red, 1)
        assert torch.all(out[:, l] >= unpooled)
        torch.testing.assert_close(out[:, l, :, prefix:], unpooled[..., prefix:], rtol=0, atol=0)
        if kernel > 1 and prefix > 0:
            mp = F.max_pool1d(unpooled[..., :prefix].reshape(-1, 1, prefix), kernel, 1, kernel // 2)
            torch.testing.assert_close(out[:, l, :, :prefix], mp.reshape(*unpooled.shape[:-1], prefix))


@SETTINGS
@given(traj=trajectories(max_group=1), name=st.sampled_from(SCORER_NAMES), query_red=st.sampled_from(["mean", "max"]))
def test_group_one_head_reduction_is_identity(traj, name: str, query_red: str) -> None:
    by_mean = SCORERS.build({"name": name, "query_reduction": query_red, "head_reduction": "mean"}).score(traj)
    by_max = SCORERS.build({"name": name, "query_reduction": query_red, "head_reduction": "max"}).score(traj)
    assert torch.equal(by_mean, by_max)
    scorer = SCORERS.build({"name": name, "query_reduction": query_red})
    for l, layer in enumerate(traj.layers):
        qs = scorer.query_scores(layer)
        over_queries = qs.mean(2) if query_red == "mean" else qs.amax(2)
        torch.testing.assert_close(by_mean[:, l], over_queries, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", SCORER_NAMES)
def test_low_precision_inputs_give_float32_scores(dtype: torch.dtype, name: str) -> None:
    dims = CaptureDims(futures=2, kv_heads=2, group=2, queries=3, prompt=7, response=3, head_dim=4, hidden=6)
    low = make_capture(dims, seed=2, dtype=dtype)
    upcast = replace(
        low,
        queries=low.queries.float(),
        prompt_keys=low.prompt_keys.float(),
        prompt_values=low.prompt_values.float(),
        response_keys=low.response_keys.float(),
        response_values=low.response_values.float(),
        o_proj=low.o_proj.float(),
    )
    scorer = SCORERS.build(name)
    out = scorer.score(make_trajectories((low,)))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, scorer.score(make_trajectories((upcast,))), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# registry and config validation


def test_registry_names() -> None:
    assert set(SCORER_NAMES) <= set(SCORERS.names())


@pytest.mark.parametrize(
    "name, cls, config_cls",
    [
        ("attention_mass", AttentionMassScorer, AttentionMassConfig),
        ("loo", LOOScorer, LOOConfig),
        ("projected_loo", ProjectedLOOScorer, ProjectedLOOConfig),
    ],
)
def test_registry_round_trip(name: str, cls: type[Scorer], config_cls: type) -> None:
    scorer = SCORERS.build({"name": name, "query_reduction": "max", "pool_kernel": 3})
    assert type(scorer) is cls
    assert type(scorer.config) is config_cls
    assert scorer.config.query_reduction == "max" and scorer.config.head_reduction == "mean"
    assert scorer.config.pool_kernel == 3
    dumped = scorer.config.model_dump()
    assert dumped["name"] == name
    rebuilt = SCORERS.build(dumped)
    assert type(rebuilt) is cls and rebuilt.config == scorer.config
    assert SCORERS.build(scorer.config).config == scorer.config
    assert type(SCORERS.build(name)) is cls


def test_projected_loo_build_from_mapping() -> None:
    scorer = SCORERS.build({"name": "projected_loo", "query_reduction": "max"})
    assert isinstance(scorer, ProjectedLOOScorer)
    assert scorer.config == ProjectedLOOConfig(query_reduction="max")


@pytest.mark.parametrize("name", SCORER_NAMES)
@pytest.mark.parametrize(
    "field, value",
    [
        ("pool_kernel", 2),
        ("pool_kernel", 0),
        ("pool_kernel", -3),
        ("query_reduction", "median"),
        ("head_reduction", "sum"),
    ],
)
def test_invalid_configs_name_the_parameter(name: str, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SCORERS.build({"name": name, field: value})


def test_unknown_field_and_name_rejected() -> None:
    with pytest.raises(ValueError, match="eps"):
        SCORERS.build({"name": "attention_mass", "eps": 1e-3})
    with pytest.raises(ValueError, match="eps"):
        SCORERS.build({"name": "loo", "eps": 1e-6})
    with pytest.raises(ValueError, match="unknown scorer"):
        SCORERS.build("nope")


@SETTINGS
@given(traj=trajectories(), name=st.sampled_from(SCORER_NAMES))
def test_shared_kv_heads_average_every_query_head_of_the_layer(traj, name: str) -> None:
    """kv_heads="shared" (TOVA): every KV head gets the mean over all the layer's query heads."""
    shared = SCORERS.build({"name": name, "kv_heads": "shared"})
    out = shared.score(traj)
    for l, layer in enumerate(traj.layers):
        per_query_head = shared.query_scores(layer).mean(dim=2)  # (M, H, n)
        expected = per_query_head.mean(dim=1, keepdim=True).expand(-1, layer.num_kv_heads, -1)
        torch.testing.assert_close(out[:, l], expected, rtol=1e-6, atol=1e-7)
