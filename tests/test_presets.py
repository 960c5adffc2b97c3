"""Every preset against an independent brute-force implementation of its paper's rule.

The references read the model's own queries, keys and values (recorded from its eager
attention, :mod:`recording`), recompute attention in float64 with explicit loops and masks,
and apply the paper's selection rule as its reference code does, in reference terms: a
capacity C of kept prompt tokens per head, the observation window counted inside it. lorekv
keeps B candidates and, in query-aware mode, re-feeds the prompt's last token on top, so a
preset at budget B is compared with the reference at C = B + 1 (query-aware) or C = B
(query-agnostic). Ties go to the lower index in both.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from recording import reference
from tiny_models import random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf import ModelRollout, evictable_layers, prepare
from lorekv.presets import PRESETS

N = 60
GROUP = 2  # tiny_llama: 4 query heads over 2 KV heads


def setup(seed: int = 0, n: int = N):
    model = tiny_llama(100 + seed, layers=3)
    ids = random_ids(n, seed=200 + seed)
    return model, ids, reference(model, ids)


def top(values: torch.Tensor, k: int) -> set[int]:
    """The k largest entries of a 1-D tensor, ties to the lower index."""
    order = sorted(range(len(values)), key=lambda j: (-float(values[j]), j))
    return set(order[: max(k, 0)])


def attention_rows(rec: dict, positions: range, n: int) -> torch.Tensor:
    """(H, q, n) float64 causal softmax of the queries at ``positions`` over prompt keys 0..n-1."""
    q = rec["query"][:, positions.start : positions.stop].double()
    k = rec["key"][:, :n].double().repeat_interleave(GROUP, dim=0)
    logits = (q @ k.transpose(-1, -2)) * rec["scaling"]
    for i, p in enumerate(positions):
        logits[:, i, p + 1 :] = -math.inf
    return torch.softmax(logits, dim=-1)


def snapkv_scores(rec: dict, n: int, w: int, kernel: int) -> torch.Tensor:
    """(G, n - w) SnapKV: window attention averaged over the window, group-mean, max-pooled on the prefix."""
    a = attention_rows(rec, range(n - w, n), n)[..., : n - w].mean(dim=1)  # (H, n - w)
    per_kv = a.view(-1, GROUP, n - w).mean(dim=1)
    return F.max_pool1d(per_kv.unsqueeze(1), kernel, 1, kernel // 2).squeeze(1)


def kept(compressed) -> list[list[set[int]]]:
    return [[set(h.tolist()) for h in heads] for heads in compressed.selection.indices]


def as_candidates(sets: list[list[set[int]]], n: int, query_aware: bool) -> list[list[set[int]]]:
    """Reference sets over the prompt -> sets over lorekv's candidates (the re-fed token removed)."""
    return [[s - {n - 1} if query_aware else s for s in heads] for heads in sets]


MODES = pytest.mark.parametrize("query_aware", [True, False], ids=["query-aware", "query-agnostic"])


@MODES
@pytest.mark.parametrize("budget,window", [(20, 6), (12, 8)])
def test_snapkv_equals_the_reference_rule(query_aware: bool, budget: int, window: int) -> None:
    model, ids, recs = setup(1)
    capacity = budget + query_aware
    expected = []
    for layer in evictable_layers(model):
        scores = snapkv_scores(recs[layer], N, window, 7)
        window_tokens = set(range(N - window, N))
        expected.append([top(s, capacity - window) | window_tokens for s in scores])
    compressed = Pipeline.from_config(preset("snapkv", budget, window=window)).compress(
        model, ids, query_aware=query_aware
    )
    assert kept(compressed) == as_candidates(expected, N, query_aware)


def rkv_scores(rec: dict, n: int, w: int, kernel: int, lam: float, threshold: float) -> torch.Tensor:
    """(G, n - w) R-KV's final score (rkv/compression/r1_kv.py), loops in float64: the window's
    logits maxed over the group before the softmax over the tokens before the window, averaged,
    max-pooled; minus the softmaxed mean cosine similarity, each row's newest near-copy forgotten."""
    q, k = rec["query"].double(), rec["key"][:, :n].double()
    kv_heads, m = k.shape[0], n - w
    out = torch.zeros(kv_heads, m, dtype=torch.float64)
    for g in range(kv_heads):
        attention = torch.zeros(m, dtype=torch.float64)
        for t in range(n - w, n):
            logits = torch.tensor(
                [
                    max(float(q[h, t] @ k[g, j]) for h in range(g * GROUP, (g + 1) * GROUP)) * rec["scaling"]
                    for j in range(m)
                ]
            )
            attention += torch.softmax(logits, dim=0) / w
        pooled = torch.tensor([float(attention[max(0, j - kernel // 2) : j + kernel // 2 + 1].max()) for j in range(m)])
        unit = [k[g, i] / (float(k[g, i].norm()) + 1e-8) for i in range(n)]
        similarity = [[0.0 if i == j else float(unit[i] @ unit[j]) for j in range(n)] for i in range(n)]
        for i in range(n):
            near = [j for j in range(n) if similarity[i][j] > threshold]
            similarity[i][max(near) if near else 0] = 0.0
        column = torch.tensor([sum(similarity[i][j] for i in range(n)) / n for j in range(n)])
        redundancy = torch.softmax(column, dim=0)[:m]
        out[g] = lam * pooled - (1 - lam) * redundancy
    return out


@MODES
@pytest.mark.parametrize("budget,window", [(20, 8), (14, 4)])
def test_rkv_equals_the_reference_rule(query_aware: bool, budget: int, window: int) -> None:
    model, ids, recs = setup(4)
    capacity = budget + query_aware
    expected = []
    for layer in evictable_layers(model):
        scores = rkv_scores(recs[layer], N, window, 7, 0.07, 0.5)
        expected.append([top(s, capacity - window) | set(range(N - window, N)) for s in scores])
    compressed = Pipeline.from_config(preset("rkv", budget, window=window)).compress(
        model, ids, query_aware=query_aware
    )
    assert kept(compressed) == as_candidates(expected, N, query_aware)


def pyramid_reference(n: int, capacity: int, window: int, layers: int, beta: float) -> list[int]:
    """KVCache-Factory's PyramidKV prefix budgets, integer arithmetic."""
    scored = capacity - window
    if n < 2 * scored:
        return [scored] * layers
    low = math.floor(scored / beta)
    high = 2 * scored - low
    if high >= n - window:
        high, low = n - window, 2 * scored - (n - window)
    step = (high - low) // (layers - 1)
    return [high - layer * step for layer in range(layers)]


def pyramid_exact(n: int, capacity: int, window: int, layers: int, beta: float) -> list[int]:
    """The same linear schedule rounded by largest remainder (exact total)."""
    scored = capacity - window
    if n < 2 * scored:
        return [scored] * layers
    low = Fraction(scored) / Fraction(beta)
    high = 2 * scored - low
    if high >= n - window:
        high, low = Fraction(n - window), 2 * scored - Fraction(n - window)
    quotas = [high - (high - low) * Fraction(layer, layers - 1) for layer in range(layers)]
    out = [math.floor(q) for q in quotas]
    for i in sorted(range(layers), key=lambda i: (out[i] - quotas[i], i))[: layers * scored - sum(out)]:
        out[i] += 1
    return out


@MODES
@pytest.mark.parametrize("beta,rounding", [(20.0, "reference"), (4.0, "reference"), (20.0, "exact"), (3.0, "exact")])
def test_pyramidkv_equals_the_reference_rule(query_aware: bool, beta: float, rounding: str) -> None:
    model, ids, recs = setup(2)
    budget, window = 20, 6
    capacity = budget + query_aware
    layers = evictable_layers(model)
    schedule = (pyramid_reference if rounding == "reference" else pyramid_exact)(N, capacity, window, len(layers), beta)
    expected = []
    for layer, prefix in zip(layers, schedule, strict=True):
        scores = snapkv_scores(recs[layer], N, window, 7)
        expected.append([top(s, prefix) | set(range(N - window, N)) for s in scores])
    config = preset("pyramidkv", budget, window=window, beta=beta, rounding=rounding)
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates(expected, N, query_aware)
    assert len({len(heads[0]) for heads in expected}) > 1, "test needs a real pyramid"


@MODES
@pytest.mark.parametrize("alpha", [0.2, 0.0, 1.0])
def test_ada_kv_equals_the_reference_rule(query_aware: bool, alpha: float) -> None:
    model, ids, recs = setup(3)
    budget, window = 20, 6
    capacity = budget + query_aware
    scored = capacity - window
    floor = math.floor(round(alpha * scored, 9))
    expected = []
    for layer in evictable_layers(model):
        scores = snapkv_scores(recs[layer], N, window, 7)  # (G, n - w), raw, compared across heads
        heads = [top(s, floor) for s in scores]
        rest = sorted(
            ((g, j) for g in range(len(scores)) for j in range(N - window) if j not in heads[g]),
            key=lambda gj: (-float(scores[gj]), gj),
        )
        for g, j in rest[: len(scores) * (scored - floor)]:
            heads[g].add(j)
        expected.append([h | set(range(N - window, N)) for h in heads])
    compressed = Pipeline.from_config(preset("ada_kv", budget, window=window, alpha=alpha)).compress(
        model, ids, query_aware=query_aware
    )
    assert kept(compressed) == as_candidates(expected, N, query_aware)
    if alpha < 1:
        assert any(len(a) != len(b) for a, b in expected), "test needs heads of different budgets"


@MODES
def test_tova_equals_the_reference_rule(query_aware: bool) -> None:
    model, ids, recs = setup(4)
    budget = 15
    expected = []
    for layer in evictable_layers(model):
        last = attention_rows(recs[layer], range(N - 1, N), N)[:, 0]  # (H, n): the last query, itself included
        scores = last.mean(dim=0)  # over ALL query heads of the layer
        if query_aware:  # candidates exclude the re-fed last token, which kvpress pins
            chosen = top(scores[: N - 1], budget) | {N - 1}
        else:
            chosen = top(scores, budget)
        expected.append([chosen] * (4 // GROUP))
    compressed = Pipeline.from_config(preset("tova", budget)).compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates(expected, N, query_aware)


@MODES
def test_streaming_llm_equals_the_reference_rule(query_aware: bool) -> None:
    model, ids, _ = setup(5)
    budget = 12
    capacity = budget + query_aware
    chosen = set(range(4)) | set(range(N - (capacity - 4), N))
    compressed = Pipeline.from_config(preset("streaming_llm", budget)).compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates([[chosen] * 2] * 3, N, query_aware)


def future_scores(model, ids: torch.Tensor, futures: torch.Tensor, rule: str) -> dict[int, torch.Tensor]:
    """Layer -> (M, G, n) per-future scores from the model's own attention over prompt + future.

    ``rule`` "projected_loo": ||W_o^h (o - o_{-j})|| with o_{-j} recomputed without key j;
    "attention_mass": a_j. Mean over the T future queries, then over the group's query heads.
    """
    n = ids.shape[1]
    out: dict[int, list[torch.Tensor]] = {}
    for future in futures:
        recs = reference(model, torch.cat([ids, future.view(1, -1)], dim=1))
        for layer in evictable_layers(model):
            rec = recs[layer]
            total = n + len(future)
            q = rec["query"][:, n:total].double()  # (H, T, d)
            k = rec["key"][:, :total].double().repeat_interleave(GROUP, dim=0)
            v = rec["value"][:, :total].double().repeat_interleave(GROUP, dim=0)
            logits = (q @ k.transpose(-1, -2)) * rec["scaling"]  # (H, T, S)
            for t in range(len(future)):
                logits[:, t, n + t + 1 :] = -math.inf
            weights = torch.softmax(logits, dim=-1)
            if rule == "attention_mass":
                per_head = weights[..., :n].mean(dim=1)  # (H, n)
            else:
                o = weights @ v  # (H, T, d)
                d = q.shape[-1]
                w_o = rec["o_proj"].detach().double()
                per_head = torch.zeros(q.shape[0], n, dtype=torch.float64)
                for j in range(n):
                    dropped = logits.clone()
                    dropped[..., j] = -math.inf
                    change = o - torch.softmax(dropped, dim=-1) @ v  # (H, T, d)
                    for h in range(q.shape[0]):
                        per_head[h, j] = (change[h] @ w_o[:, h * d : (h + 1) * d].T).norm(dim=-1).mean()
            out.setdefault(layer, []).append(per_head.view(-1, GROUP, n).mean(dim=1))
    return {layer: torch.stack(values) for layer, values in out.items()}


@pytest.mark.parametrize(
    "name,rule,query_aware",
    [
        ("lore_kv", "projected_loo", True),
        ("lore_kv", "projected_loo", False),
        ("greedy_lookahead", "attention_mass", True),
    ],
)
def test_future_presets_equal_the_deletion_rule_on_the_models_own_attention(name, rule, query_aware) -> None:
    """LORE-KV: the mean over futures of the projected leave-one-out cost, recomputed by deleting
    each key from the model's own attention; top-B per KV head. The futures' tokens are lorekv's
    (sampling is tested on its own); everything after them is recomputed here. Query-agnostic,
    with futures that continue the context (the preset's own query-agnostic parts, KVzip's, are
    tested in tests/test_pipeline_modes.py)."""
    model = tiny_llama(106, layers=3)
    n = 40
    ids = random_ids(n, seed=206)
    budget = 9
    continuing = {"agnostic_sampler": None, "agnostic_scorer": None, "agnostic_policy": None}
    pipeline = Pipeline.from_config(preset(name, budget).override(continuing))
    compressed = pipeline.compress(model, ids, query_aware=query_aware)
    futures = pipeline.sampler.sample(ModelRollout(prepare(model), ids, evictable_layers(model))).token_ids
    candidates = n - 1 if query_aware else n
    expected = []
    for per_future in future_scores(model, ids, futures, rule).values():
        combined = per_future.mean(dim=0)[:, :candidates]  # (G, candidates)
        expected.append([top(s, budget) for s in combined])
    assert kept(compressed) == expected


def test_presets_list_their_papers_and_differences() -> None:
    for name, make in PRESETS.items():
        doc = make.__doc__ or ""
        assert "arxiv.org/abs/" in doc, f"{name} cites no paper"
    assert "greedy_lookahead" in PRESETS and "lookahead" not in PRESETS


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "ada_kv"])
def test_window_presets_refuse_a_budget_within_the_window(name: str) -> None:
    with pytest.raises(ValueError, match=r"budget must be > window.*window=32"):
        preset(name, 32)
    assert preset(name, 32, window=8).policy.recent == 8


def test_rkv_redundancy_in_row_chunks_equals_the_whole_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    from lorekv.scorers import redundancy

    keys = torch.randn(2, 37, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    keys[:, 20] = keys[:, 3] * 2  # near-copies
    whole = redundancy.key_redundancy(keys, 0.5)
    monkeypatch.setattr(redundancy, "SCORE_CHUNK", 2 * 37 * 5)  # five rows a chunk
    torch.testing.assert_close(redundancy.key_redundancy(keys, 0.5), whole, rtol=1e-12, atol=1e-14)
