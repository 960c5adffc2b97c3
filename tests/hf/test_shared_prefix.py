"""Futures as branches of the prompt cache: cascade attention, one-pass prefill, no KV copies.

References here share no code with the fast path: attention is a float64 softmax over the
concatenated [prefix, own] keys with the mask written out by hand, and the one-pass prefill
is compared with a two-pass prefill through the model itself.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import random_ids, tiny_gemma3, tiny_llama

from lorekv import token_rules
from lorekv.hf.attention import (
    forward,
    partial_attention,
    prepare,
    reference_partial_attention,
    shared_prefix_attention,
)
from lorekv.hf.cache import PADDING, PositionedCache, PositionedLayer
from lorekv.hf.rollout import ModelRollout


def reference_attention(query, prefix_keys, prefix_values, prefix_pos, keys, values, key_pos, query_pos, window, scale):
    """float64 softmax over [prefix, own] per branch, the visibility rule spelled out; and the
    (b, h, q, 2) log-sum-exps of the visible logits over the prefix and over the own keys."""
    b, h, q, d = query.shape
    g = keys.shape[1]
    out = torch.zeros(b, h, q, d, dtype=torch.float64)
    lse = torch.zeros(b, h, q, 2, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            gi = hi // (h // g)
            k = torch.cat([prefix_keys[0, gi], keys[bi, gi]]).double()
            v = torch.cat([prefix_values[0, gi], values[bi, gi]]).double()
            pos = torch.cat([prefix_pos[0, gi], key_pos[bi, gi]])
            for qi in range(q):
                qp = int(query_pos[qi])
                seen = [p != PADDING and p <= qp and (window is None or p > qp - window) for p in pos.tolist()]
                ok = torch.tensor(seen)
                logits = (k @ query[bi, hi, qi].double()) * scale
                logits[~ok] = -torch.inf
                out[bi, hi, qi] = torch.softmax(logits, 0) @ v
                cut = prefix_keys.shape[2]
                lse[bi, hi, qi] = torch.stack([logits[:cut].logsumexp(0), logits[cut:].logsumexp(0)])
    return out, lse


@given(
    branches=st.integers(1, 3),
    group=st.sampled_from([1, 2]),
    prefix_len=st.integers(1, 9),
    own=st.integers(0, 3),
    q=st.integers(1, 3),
    window=st.sampled_from([None, 3, 6]),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_cascade_attention_equals_attention_over_the_concatenation(
    branches, group, prefix_len, own, q, window, padded, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    g, d = 2, 8
    h = g * group
    prefix = PositionedLayer(window)
    prefix_pos = torch.arange(prefix_len).view(1, 1, -1).repeat(1, g, 1)
    if padded:  # an evicted prefix: each head keeps a subset, padding at the end
        keep = torch.rand(1, g, prefix_len, generator=gen) < 0.6
        keep[..., 0] = True
        prefix_pos = torch.where(keep, prefix_pos, torch.full_like(prefix_pos, PADDING))
    prefix.set(
        torch.randn(1, g, prefix_len, d, generator=gen),
        torch.randn(1, g, prefix_len, d, generator=gen),
        prefix_pos,
        padded=padded,
    )
    start = prefix_len
    key_pos = torch.arange(start, start + own + q).view(1, 1, -1).expand(branches, g, -1).contiguous()
    keys = torch.randn(branches, g, own + q, d, generator=gen)
    values = torch.randn(branches, g, own + q, d, generator=gen)
    query = torch.randn(branches, h, q, d, generator=gen)
    query_pos = torch.arange(start + own, start + own + q)
    causal = own == 0 and q > 1 and window is None  # a teacher-forced step: the own part is causal
    got, lse_p, lse_s = shared_prefix_attention(
        query, keys, values, key_pos, query_pos, prefix.keys, prefix.values, prefix.positions, padded, window, 0.35,
        causal,
    )  # fmt: skip
    want, want_lse = reference_attention(
        query, prefix.keys, prefix.values, prefix.positions, keys, values, key_pos, query_pos, window, 0.35
    )
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack([lse_p, lse_s], dim=-1).double(), want_lse, rtol=1e-5, atol=1e-5)


@given(
    rows=st.integers(2, 3),
    per_row=st.integers(1, 3),
    prefix_len=st.integers(2, 8),
    q=st.integers(1, 2),
    window=st.sampled_from([None, 4]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_cascade_attention_over_a_batch_of_prefixes_reads_each_branchs_own_row(
    rows, per_row, prefix_len, q, window, seed
) -> None:
    """P left-padded prefix rows of different lengths, each continued by its own branches at its
    own positions: branch b sees prefix row b // per_row only, as the concatenation does."""
    gen = torch.Generator().manual_seed(seed)
    g, h, d = 1, 2, 8
    lengths = torch.randint(1, prefix_len + 1, (rows,), generator=gen)
    positions = torch.arange(prefix_len) - (prefix_len - lengths)[:, None]
    prefix_pos = positions.masked_fill(positions < 0, PADDING).view(rows, 1, prefix_len).repeat(1, g, 1)
    prefix_keys = torch.randn(rows, g, prefix_len, d, generator=gen)
    prefix_values = torch.randn(rows, g, prefix_len, d, generator=gen)
    b = rows * per_row
    starts = lengths.repeat_interleave(per_row)
    query_pos = starts[:, None] + torch.arange(q)
    keys = torch.randn(b, g, q, d, generator=gen)
    values = torch.randn(b, g, q, d, generator=gen)
    key_pos = query_pos.view(b, 1, q).expand(b, g, q).contiguous()
    query = torch.randn(b, h, q, d, generator=gen)
    got, _, _ = shared_prefix_attention(
        query, keys, values, key_pos, query_pos, prefix_keys, prefix_values, prefix_pos, True, window, 0.35
    )
    for branch in range(b):
        row = branch // per_row
        for qi in range(q):
            want = reference_attention(
                query[branch : branch + 1, :, qi : qi + 1],
                prefix_keys[row : row + 1],
                prefix_values[row : row + 1],
                prefix_pos[row : row + 1],
                keys[branch : branch + 1],
                values[branch : branch + 1],
                key_pos[branch : branch + 1],
                query_pos[branch, qi : qi + 1],
                window,
                0.35,
            )[0]
            torch.testing.assert_close(got[branch : branch + 1, :, qi : qi + 1].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", [partial_attention, reference_partial_attention], ids=["fused-cpu", "reference"])
@pytest.mark.parametrize("masked", [False, True])
def test_partial_attention_equals_float64_softmax(kernel, masked: bool) -> None:
    """Both the CPU kernel and the plain path other devices take."""
    gen = torch.Generator().manual_seed(3)
    query, keys, values = (torch.randn(2, 3, 5, 8, generator=gen) for _ in range(3))
    mask = torch.rand(2, 3, 5, 5, generator=gen) < 0.5 if masked else None
    if masked:
        mask[0, 0, 0] = False  # a query that sees nothing: output 0, log-sum-exp -inf
    out, lse = kernel(query, keys, values, mask, 0.5)
    logits = (query.double() @ keys.double().transpose(-1, -2)) * 0.5
    if masked:
        logits = logits.masked_fill(~mask, -torch.inf)
    want_lse = torch.logsumexp(logits, -1)
    want = (torch.exp(logits - want_lse.unsqueeze(-1)).nan_to_num(0.0)) @ values.double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-6)
    if masked:
        assert lse[0, 0, 0] == -torch.inf and out[0, 0, 0].abs().max() == 0


def two_pass_caches(model, ids):
    """The prefill as it was: positions 0..n-2, a copy, then n-1 (the model fed twice)."""
    n = ids.shape[1]
    cache = PositionedCache.for_model(model.config)
    forward(model, ids[:, : n - 1], cache, torch.arange(n - 1))
    head = cache.copy()
    logits = forward(model, ids[:, n - 1 :], cache, torch.tensor([n - 1]))
    return cache, head, logits


@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3-hybrid"])
@pytest.mark.parametrize("n", [3, 5, 12])
def test_one_pass_prefill_gives_the_two_pass_caches(build, n: int) -> None:
    """Both caches, sliding layers included (the hybrid's window is 6: n=12 overflows it)."""
    model = prepare(build())
    ids = random_ids(n, seed=n)
    rollout = ModelRollout(model, ids, [0])
    full, head, logits = two_pass_caches(model, ids)
    torch.testing.assert_close(rollout.last_logits, logits[:, -1], rtol=1e-5, atol=1e-5)
    for mine, theirs in ((rollout.cache, full), (rollout.head_cache, head)):
        for a, b in zip(mine.layers, theirs.layers, strict=True):
            assert torch.equal(a.positions, b.positions)
            torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
    for a, b in zip(rollout.cache.layers, rollout.head_cache.layers, strict=True):
        assert a.keys.untyped_storage().data_ptr() == b.keys.untyped_storage().data_ptr(), "head cache was copied"


def test_futures_store_their_own_tokens_only_and_leave_the_prompt_cache_alone() -> None:
    model = prepare(tiny_llama(layers=2))
    ids = random_ids(20, seed=1)
    rollout = ModelRollout(model, ids, [0, 1])
    before = [layer.keys.clone() for layer in rollout.cache.layers]
    futures = rollout.decode(token_rules.greedy, num_futures=3, num_tokens=4)
    for layer in futures.layers:
        assert layer.response_keys.shape[:3] == (3, 2, 4)
        assert layer.prompt_keys.data_ptr() == rollout.cache.layers[layer.layer_idx].keys.data_ptr()
    for layer, old in zip(rollout.cache.layers, before, strict=True):
        assert torch.equal(layer.keys, old) and layer.keys.shape[2] == 20
    branch = rollout.cache.branches(3)
    branch.reserve(3, 4)
    per_token = 2 * 2 * 8 * 8  # keys + values, G=2, d=8, float64
    assert branch.allocated_bytes() == 2 * 3 * 4 * per_token, "branches hold M x T entries, no prompt copy"
    assert branch.get_seq_length() == 20


def test_prefill_capture_of_a_window_holds_only_the_window() -> None:
    """A view of the last w queries would keep every layer's (1, H, n, d) prefill queries alive."""
    model = prepare(tiny_llama(layers=2))
    rollout = ModelRollout(model, random_ids(30, seed=2), [0, 1], prefill_window=4)
    for idx in (0, 1):
        (queries,) = rollout.batch.capture.queries[idx]
        assert queries.shape[2] == 4
        assert queries.untyped_storage().nbytes() == queries.numel() * queries.element_size()
