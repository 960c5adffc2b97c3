"""Centring of the values in the deletion scorers' dot-product expansions.

||W_o^h (v_j - o)||^2 = v^T G v - 2 v^T G o + o^T G o cancels catastrophically when the values
share a large component c (a v_proj bias, large activations): the three terms are of the size
||W c||^2. The scorers expand around the mean prompt value c_g of each KV head instead (exact in
exact arithmetic: v_j - o = (v_j - c) - (o - c), and o - c = sum_i a_i (v_i - c)).

The edge: values = offset + standard normal spread, the offset 100x the spread, either the
same in every coordinate or a random per-KV-head bias vector; prompt and response values
share it, as they do in a model. References are computed in float64 directly as
||W_o^h (v_j - o)||^2 with o = sum_i a_i v_i from the same (possibly bf16-rounded) inputs,
never via the expansion.

Measured at the edge (d = 8, 5 seeds x 2 offsets, max over all (future, head, query, token)),
float32 and bf16 inputs alike: relative error of the squared distances 2.8e-2 .. 7.3e-2 without
centring, <= 9.6e-7 with it; of the scores 1.4e-2 .. 3.6e-2 without, <= 8.7e-7 with. Bounds:
- squared distances and scores: 1e-5 relative (10x the measured worst; the scores add the
  rounding of a_j and, for each query's dominant token, of o_{-j*}).
- bf16 captures are scored in float32 (lorekv.scorers.attention.compute_dtype), so the scorer's
  own error is float32's and the bound is the same; the bf16 rounding of the inputs is shared
  with the reference, it is not the scorer's error and not measured here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import CaptureDims, layer_captures, make_capture

from lorekv.scorers import LOOConfig, LOOScorer, ProjectedLOOConfig, ProjectedLOOScorer, causal_attention
from lorekv.scorers.loo import sq_distances
from lorekv.scorers.projected_loo import gram_matrices, projected_sq_distances
from lorekv.trajectories import LayerCapture

EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps
SQ_RTOL = 1e-5
SCORE_RTOL = 1e-5
OFFSET = 100.0
EDGE_DIMS = CaptureDims(futures=2, kv_heads=2, group=2, queries=4, prompt=40, response=4, head_dim=8, hidden=10)

Offset = Literal["constant", "bias"]


def with_offset(layer: LayerCapture, kind: Offset, scale: float, seed: int) -> LayerCapture:
    """Every value (prompt and response) plus a shared vector per KV head, ``scale`` x the spread.

    ``constant``: ``scale`` in every coordinate (the same for all KV heads). ``bias``: a random
    direction per KV head with norm ``scale * sqrt(d)``, like a v_proj bias.
    """
    g, _, d = layer.prompt_values.shape
    if kind == "constant":
        offset = torch.full((g, 1, d), scale)
    else:
        direction = torch.randn(g, 1, d, generator=torch.Generator().manual_seed(seed))
        offset = direction / direction.norm(dim=-1, keepdim=True) * scale * d**0.5
    return replace(
        layer,
        prompt_values=layer.prompt_values + offset.to(layer.prompt_values.dtype),
        response_values=layer.response_values + offset[None].to(layer.response_values.dtype),
    )


def edge_capture(seed: int, kind: Offset, dtype: torch.dtype) -> LayerCapture:
    """:data:`EDGE_DIMS` capture, standard normal spread plus an offset 100x it, rounded to ``dtype``."""
    return with_offset(make_capture(EDGE_DIMS, seed), kind, OFFSET, seed + 1).to(dtype)


def head_projections(layer: LayerCapture) -> torch.Tensor:
    """(H, D, d) float64 W_o^h = o_proj[:, h*d:(h+1)*d]."""
    d = layer.queries.shape[-1]
    o_proj = layer.o_proj.double()
    return torch.stack([o_proj[:, h * d : (h + 1) * d] for h in range(layer.num_heads)])


def reference_outputs(layer: LayerCapture) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 weights (M, H, T, n+R) and outputs o = sum_i a_i v_i (M, H, T, d), per head by index."""
    kv_of_head = torch.arange(layer.num_heads) // layer.group_size
    keys = layer.keys().double()[:, kv_of_head]
    values = layer.values().double()[:, kv_of_head]
    positions = torch.arange(keys.shape[2])
    visible = positions[None, :] <= layer.query_positions[:, None]
    logits = (layer.queries.double() @ keys.transpose(-1, -2)) * layer.scaling
    weights = torch.softmax(logits.masked_fill(~visible, -torch.inf), dim=-1)
    return weights, weights @ values


def reference_sq_distances(layer: LayerCapture, projected: bool) -> torch.Tensor:
    """(M, H, T, n) float64 ||W_o^h (v_j - o)||^2 (W = I unless ``projected``), by forming v_j - o."""
    kv_of_head = torch.arange(layer.num_heads) // layer.group_size
    _, outputs = reference_outputs(layer)
    diff = layer.prompt_values.double()[kv_of_head][None, :, None] - outputs[:, :, :, None]  # (M, H, T, n, d)
    if projected:
        diff = torch.einsum("mhtnd,hDd->mhtnD", diff, head_projections(layer))
    return diff.pow(2).sum(dim=-1)


def reference_scores(layer: LayerCapture, projected: bool) -> torch.Tensor:
    """(M, H, T, n) float64 a_j / (1 - a_j) ||W_o^h (v_j - o)||, the deletion score in closed form."""
    weights, _ = reference_outputs(layer)
    a = weights[..., : layer.prompt_length]
    return a / (1 - a) * reference_sq_distances(layer, projected).sqrt()


def scorer_sq_distances(layer: LayerCapture, projected: bool) -> torch.Tensor:
    """(M, H, T, n) the squared distances exactly as the scorers compute them (centred expansion)."""
    attention = causal_attention(layer)
    values, output = attention.centred_prompt_values(), attention.centred_output
    if not projected:
        return sq_distances(values, output)
    return projected_sq_distances(values, output, gram_matrices(layer.o_proj.to(values.dtype), layer.num_heads))


def max_relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float(((got.double() - reference).abs() / reference.abs()).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["constant", "bias"])
@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_sq_distances_with_a_large_common_offset(dtype: torch.dtype, kind: Offset, projected: bool, seed: int) -> None:
    """Offset 100x the spread: squared distances within 1e-5 relative of the float64 direct form
    (3e-2 .. 7e-2 without centring), for float32 and bf16 captures (see the module docstring)."""
    layer = edge_capture(seed, kind, dtype)
    got = scorer_sq_distances(layer, projected)
    assert got.dtype == torch.float32
    error = max_relative_error(got, reference_sq_distances(layer, projected))
    assert error < SQ_RTOL, f"relative error {error:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["constant", "bias"])
@pytest.mark.parametrize("projected", [False, True])
def test_scores_with_a_large_common_offset(dtype: torch.dtype, kind: Offset, projected: bool) -> None:
    """The scorers' scores at the edge, against the float64 closed form: 1e-5 relative."""
    layer = edge_capture(0, kind, dtype)
    scorer = ProjectedLOOScorer(ProjectedLOOConfig()) if projected else LOOScorer(LOOConfig())
    got = scorer.query_scores(layer)
    assert got.dtype == torch.float32
    reference = reference_scores(layer, projected)
    assert bool((reference > 0).all()), "every prompt token is visible to every query here"
    error = max_relative_error(got, reference)
    assert error < SCORE_RTOL, f"relative error {error:.2e}"


@settings(deadline=None, max_examples=40)
@given(
    layer=layer_captures(),
    kind=st.sampled_from(["constant", "bias"]),
    log_scale=st.floats(0, 3),
    projected=st.booleans(),
)
def test_centred_error_is_set_by_the_spread_not_the_offset(
    layer: LayerCapture, kind: Offset, log_scale: float, projected: bool
) -> None:
    """Random captures with an offset 1..1000x the spread: the float32 squared distances are within
    64 eps32 D (||W|| (||v_j - c|| + ||o - c||))^2 of the float64 direct form, c the true common
    offset (any d, including small distances where a relative bound is meaningless). This is
    the rounding bound of test_scorers with the norms of the centred vectors: without centring
    the error scales with the offset squared and exceeds it by up to 1e6."""
    shifted = with_offset(layer, kind, 10**log_scale, seed=0)
    kv_of_head = torch.arange(layer.num_heads) // layer.group_size
    _, outputs = reference_outputs(layer)
    spread = layer.prompt_values.double().norm(dim=-1)[kv_of_head][None, :, None, :] + outputs.norm(dim=-1)[..., None]
    d = layer.queries.shape[-1]
    if projected:
        spread = spread * head_projections(layer).flatten(1).norm(dim=-1)[None, :, None, None]
        d = max(d, layer.o_proj.shape[0])
    bound = 64 * EPS32 * d * spread**2 + 1e-6
    error = (scorer_sq_distances(shifted, projected).double() - reference_sq_distances(shifted, projected)).abs()
    assert torch.all(error <= bound), f"max excess {(error - bound).max().item():.3g}"


@settings(deadline=None, max_examples=40)
@given(layer=layer_captures(dtype=torch.float64), log_scale=st.floats(-2, 2), projected=st.booleans())
def test_centred_expansion_equals_the_uncentred_one_in_float64(
    layer: LayerCapture, log_scale: float, projected: bool
) -> None:
    """In float64 the centred expansion equals the plain one, v^T G v - 2 v^T G o + o^T G o with the
    raw values and o = sum_i a_i v_i (formed independently): the centre (the same c_g for a KV
    head's values and its query heads' outputs) cancels. Tolerance: the plain expansion's own
    float64 rounding, 64 eps64 D (||W|| (||v_j|| + ||o||))^2, plus 1e-9 relative."""
    layer = with_offset(layer, "bias", 10**log_scale, seed=1)
    values, (_, output) = layer.prompt_values, reference_outputs(layer)
    d = layer.queries.shape[-1]
    kv_of_head = torch.arange(layer.num_heads) // layer.group_size
    scale = values.norm(dim=-1)[kv_of_head][None, :, None, :] + output.norm(dim=-1)[..., None]
    if projected:
        gram = gram_matrices(layer.o_proj, layer.num_heads)
        plain = projected_sq_distances(values, output, gram)
        scale = scale * head_projections(layer).flatten(1).norm(dim=-1)[None, :, None, None]
        d = max(d, layer.o_proj.shape[0])
    else:
        plain = sq_distances(values, output)
    centred = scorer_sq_distances(layer, projected)
    assert centred.dtype == torch.float64
    assert torch.all((centred - plain).abs() <= 64 * EPS64 * d * scale**2 + 1e-9 * plain.abs())


def test_centre_and_outputs_are_consistent_per_kv_head() -> None:
    """c_g is the mean prompt value of KV head g (float32 for a bf16 capture); the centred output of
    every query head of group g is o - c_g; :attr:`output` adds c_g back."""
    layer = edge_capture(0, "bias", torch.bfloat16)
    attention = causal_attention(layer)
    assert attention.centre.dtype == torch.float32 and attention.centred_output.dtype == torch.float32
    torch.testing.assert_close(attention.centre, layer.prompt_values.float().mean(dim=1), rtol=1e-6, atol=1e-5)
    _, outputs = reference_outputs(layer)
    kv_of_head = torch.arange(layer.num_heads) // layer.group_size
    centred = outputs - layer.prompt_values.double().mean(dim=1)[kv_of_head][None, :, None, :]
    torch.testing.assert_close(attention.centred_output.double(), centred, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention.output.double(), outputs, rtol=1e-5, atol=1e-4)
