"""Query chunking in ``Scorer.score`` and the optional ``visible_spans`` of a capture.

``Scorer.score`` hands a layer's futures and queries to ``query_scores`` in chunks of at most
``SCORE_CHUNK`` (query, head, key) elements and combines the per-chunk reductions (sum then one
division by T for ``mean``, running max for ``max``; futures side by side). The result must
equal the unchunked reduction for every registered scorer and every reduction, to float64
rounding: the combination is exact (a max of maxes, a sum of partial sums divided once by T);
only the per-query arithmetic may round differently, since BLAS may block matrix products of
different shapes differently. The memory bound follows from what ``query_scores`` is ever
given: at most ``SCORE_CHUNK`` elements per per-query tensor, whatever M, T and n are.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import CaptureDims, make_capture, make_trajectories

import lorekv.scorers.base as scorer_base
import lorekv.scorers.loo as loo
from lorekv.scorers import SCORERS
from lorekv.trajectories import LayerCapture

REDUCTIONS = [(q, h) for q in ("mean", "max") for h in ("mean", "max")]
# Every scorer that a capture's queries, keys and values alone define. The fitted ``surrogate``
# reads what the prefill recorded (and a file fitted for one model): its own tests,
# tests/scorers/test_surrogate.py, check it on the model's computation. R-KV's ``rkv`` scores its
# window's few queries whole, per KV head (its softmax is over the group's maxed logits), and is
# checked against the reference rule in tests/test_presets.py.
NAMES = [name for name in SCORERS.names() if name not in ("surrogate", "rkv")]


def capture(seed: int, *, queries: int = 11, prompt: int = 19, response: bool = True, dtype=torch.float64):
    dims = CaptureDims(
        futures=2, kv_heads=2, group=2, queries=queries, prompt=prompt,
        response=queries if response else 0, head_dim=4, hidden=6,
    )  # fmt: skip
    return make_capture(dims, seed, dtype=dtype)


def spans_capture(seed: int, dtype=torch.float64) -> LayerCapture:
    """A capture whose queries see arbitrary key ranges (KVzip-like), given as ``visible_spans``."""
    layer = capture(seed, dtype=dtype)
    t, keys = layer.queries.shape[2], layer.prompt_length + layer.response_keys.shape[2]
    gen = torch.Generator().manual_seed(seed)
    lo = torch.randint(0, keys, (t, 3, 1), generator=gen)
    hi = lo + torch.randint(0, keys, (t, 3, 1), generator=gen)
    spans = torch.cat([lo, hi], dim=-1)
    spans[:, 0] = torch.tensor([0, 1])  # every query sees key 0
    return replace(layer, visible_spans=spans)


def rows_chunk(layer: LayerCapture, rows: int) -> int:
    """The SCORE_CHUNK that gives ``rows`` query rows (future x query) per chunk of ``layer``."""
    return rows * layer.num_heads * layer.num_keys


def scores(name: str, q: str, h: str, layers: tuple[LayerCapture, ...], rows: int, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", rows_chunk(layers[0], rows))
    scorer = SCORERS.build({"name": name, "query_reduction": q, "head_reduction": h, "pool_kernel": 3})
    return scorer.score(make_trajectories(layers))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("q,h", REDUCTIONS)
@pytest.mark.parametrize("kind", ["future", "window", "spans"])
@pytest.mark.parametrize("rows", [1, 4, 11, 13])  # T = 11 queries: parts of a future, one, one and a bit
def test_chunked_scores_equal_unchunked(name: str, q: str, h: str, kind: str, rows: int, monkeypatch) -> None:
    if kind == "spans":
        layers = (spans_capture(1), spans_capture(2))
    else:
        layers = (capture(1, response=kind == "future"), capture(2, response=kind == "future"))
    whole = scores(name, q, h, layers, 10**9, monkeypatch)
    chunked = scores(name, q, h, layers, rows, monkeypatch)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "rows,expected",
    [(4, [(1, 4), (1, 4), (1, 2)] * 2), (10, [(1, 10)] * 2), (25, [(2, 10)]), (7, [(1, 7), (1, 3)] * 2)],
)
def test_query_scores_never_sees_more_than_a_chunk(name: str, rows: int, expected: list, monkeypatch) -> None:
    """The memory bound: every per-query tensor a scorer builds is at most SCORE_CHUNK elements."""
    layer = capture(3, queries=10)  # M = 2 futures of T = 10 queries
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", rows_chunk(layer, rows))
    scorer = SCORERS.build({"name": name})
    seen: list[tuple[int, int]] = []
    original = scorer.query_scores

    def spy(part: LayerCapture, *terms: object) -> torch.Tensor:
        seen.append((part.num_futures, part.queries.shape[2]))
        assert part.visible().shape[0] == part.queries.shape[2]
        assert part.response_keys.shape[0] == part.num_futures
        return original(part, *terms)

    monkeypatch.setattr(scorer, "query_scores", spy)
    scorer.score(make_trajectories((layer,)))
    from lorekv.scorers.kv_head import KVHeadScorer

    assert seen == ([] if isinstance(scorer, KVHeadScorer) else expected), "per-KV-head scorers read no query"


def test_mean_divides_by_every_query_including_those_that_cannot_see_the_token(monkeypatch) -> None:
    """A query that cannot see token j gives it 0, and still counts in the mean's T (H2O's sum / n)."""
    layer = capture(4, queries=8, prompt=8, response=False)  # queries at positions 0..7: causal prompt
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", rows_chunk(layer, 3))
    scorer = SCORERS.build({"name": "attention_mass"})
    got = scorer.score(make_trajectories((layer,)))[:, 0]
    weights = scorer.query_scores(layer)  # (M, H, T, n), 0 above the diagonal
    expected = weights.sum(dim=2) / 8
    expected = expected.view(2, 2, 2, 8).mean(dim=2)
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)
    assert torch.all(weights[..., 0, 1:] == 0)


def explicit_mask(layer: LayerCapture) -> torch.Tensor:
    """(T, n+R) bool, written out from the spans range by range."""
    spans = layer.visible_spans
    keys = layer.prompt_length + layer.response_keys.shape[2]
    expected = torch.zeros(spans.shape[0], keys, dtype=torch.bool)
    for t in range(spans.shape[0]):
        for lo, hi in spans[t].tolist():
            for j in range(max(lo, 0), min(hi, keys)):
                expected[t, j] = True
    return expected


@settings(deadline=None, max_examples=30)
@given(seed=st.integers(0, 2**20))
def test_visible_spans_equal_an_explicit_mask(seed: int) -> None:
    layer = spans_capture(seed)
    expected = explicit_mask(layer)
    n = layer.prompt_length
    assert torch.equal(layer.visible(), expected)
    assert torch.equal(layer.query_slice(2, 5).visible(), expected[2:5])
    assert torch.equal(layer.visible_at(torch.arange(expected.shape[1])), expected)
    columns = layer.visible_prompt_keys()
    assert columns.tolist() == expected[:, :n].any(dim=0).nonzero().squeeze(1).tolist()
    assert torch.equal(layer.visible_at(columns), expected[:, columns])


@settings(deadline=None, max_examples=30)
@given(seed=st.integers(0, 2**20), recorded=st.booleans())
def test_attention_mass_over_spans_equals_an_explicit_softmax(seed: int, recorded: bool) -> None:
    """Weights formed on the prompt keys some query sees (a reconstruction chunk's), zeros elsewhere,
    equal a float64 softmax over each query's visible keys; with the own keys' normaliser given as
    a recorded log-sum-exp (``lse``, the prompt part a decoy: spans make the scorer form its own)."""
    layer = spans_capture(seed)
    n, seen = layer.prompt_length, explicit_mask(layer)
    group = layer.group_size
    keys = torch.cat([layer.prompt_keys.expand(layer.num_futures, -1, -1, -1), layer.response_keys], dim=2)
    keys = keys.repeat_interleave(group, dim=1).double()  # (M, H, n+R, d)
    logits = (layer.queries.double() @ keys.transpose(-1, -2)) * layer.scaling
    logits = logits.masked_fill(~seen, -torch.inf)
    expected = torch.softmax(logits, dim=-1).nan_to_num(0.0)[..., :n]
    if recorded:
        own = logits[..., n:].logsumexp(-1)
        layer = replace(layer, lse=torch.stack([torch.full_like(own, 123.0), own], dim=-1))
    got = SCORERS.build({"name": "attention_mass"}).query_scores(layer)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_causal_capture_slices_keep_causality() -> None:
    layer = capture(5)
    assert layer.visible_spans is None
    assert torch.equal(layer.query_slice(3, 7).visible(), layer.visible()[3:7])


def test_visible_spans_shape_is_checked() -> None:
    layer = capture(6)
    with pytest.raises(ValueError, match="visible_spans"):
        replace(layer, visible_spans=torch.zeros(3, 1, 2, dtype=torch.long))


@pytest.mark.parametrize("name", ["loo", "projected_loo"])
def test_prompt_terms_are_formed_once_per_layer_whatever_the_chunks(name: str, monkeypatch) -> None:
    """The per-token terms over the whole prompt (centred values, their norms, Gram norms) are
    formed once per layer and shared by its chunks: forming them per chunk multiplies the
    scoring's largest products and its kernels by the chunk count."""
    layers = (capture(3, queries=10), capture(4, queries=10))
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", rows_chunk(layers[0], 4))  # 6 chunks a layer
    formed: list[int] = []
    original = loo.distance_terms

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        formed.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(loo, "distance_terms", counting)
    chunks: list[int] = []
    scorer = SCORERS.build({"name": name})
    query_scores = scorer.query_scores

    def spy(part: LayerCapture, *terms: object) -> torch.Tensor:
        chunks.append(len(terms))
        return query_scores(part, *terms)

    monkeypatch.setattr(scorer, "query_scores", spy)
    scorer.score(make_trajectories(layers))
    assert len(chunks) == 12 and all(chunks), "every chunk is handed its layer's terms"
    assert len(formed) == 2, f"prompt terms formed {len(formed)} times for 2 layers"


@pytest.mark.parametrize("name", NAMES)
def test_a_bf16_capture_is_scored_in_float32_without_copying_o_proj(name: str, monkeypatch) -> None:
    """A bf16 capture is scored in float32 (its queries, keys and values cast); the model's
    ``o_proj`` is not copied for the scorers that never read it, and the ones that do cast it
    themselves: the scores equal those of the capture with every tensor cast up front."""
    layers = tuple(capture(seed, dtype=torch.bfloat16) for seed in (5, 6))
    casts: list[torch.dtype] = []
    original = torch.Tensor.to

    def watching(tensor: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if any(tensor is layer.o_proj for layer in layers):
            casts.append(tensor.dtype)
        return original(tensor, *args, **kwargs)

    scorer = SCORERS.build({"name": name})
    cast = tuple(replace(layer.to(torch.float32), o_proj=layer.o_proj.float()) for layer in layers)
    expected = scorer.score(make_trajectories(cast))
    monkeypatch.setattr(torch.Tensor, "to", watching)
    got = scorer.score(make_trajectories(layers))
    monkeypatch.undo()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert len(casts) == (2 if name in ("projected_loo", "critical_mass", "kvzip_plus") else 0), casts
