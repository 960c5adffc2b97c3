"""PositionedCache: appends, reservations, forks, sliding windows and position masks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lorekv.hf.attention import position_mask
from lorekv.hf.cache import PADDING, PositionedCache
from lorekv.hf.context import ForwardPass, running


def feed(cache: PositionedCache, start: int, q: int, batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(batch, 2, q, 4, generator=g), torch.randn(batch, 2, q, 4, generator=g)
    with running(ForwardPass(cache, torch.arange(start, start + q))):
        return cache.update(keys, values, 0)


@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=5), room=st.integers(0, 12))
@settings(max_examples=40, deadline=None)
def test_reserved_appends_equal_concatenation(chunks: list[int], room: int) -> None:
    plain, reserved = PositionedCache([None]), PositionedCache([None])
    feed(plain, 0, 3), feed(reserved, 0, 3)
    reserved.reserve(1, room)
    position = 3
    for i, q in enumerate(chunks):
        a, b = feed(plain, position, q, seed=i), feed(reserved, position, q, seed=i)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        position += q
    assert torch.equal(plain.layers[0].positions, reserved.layers[0].positions)
    assert reserved.layers[0].positions[0, 0].tolist() == list(range(position))


@pytest.mark.parametrize("reserve_in", ["original", "fork", "both"])
def test_fork_and_original_are_independent_both_ways(reserve_in: str) -> None:
    """Appends to either side, in place into reserved room or not, never reach the other side."""
    cache = PositionedCache([None])
    feed(cache, 0, 5)
    if reserve_in in ("original", "both"):
        cache.reserve(1, 4)
    fork = cache.copy()
    if reserve_in in ("fork", "both"):
        fork.reserve(1, 4)
    prefix = cache.layers[0].keys.clone()
    fork_keys, _ = feed(fork, 5, 2, seed=2)
    fork_keys = fork_keys.clone()
    cache_keys, _ = feed(cache, 5, 3, seed=1)
    cache_keys = cache_keys.clone()
    feed(fork, 7, 1, seed=3)
    assert torch.equal(cache.layers[0].keys, cache_keys), "the fork's appends reached the original"
    assert torch.equal(fork.layers[0].keys[:, :, :7], fork_keys), "the original's appends reached the fork"
    assert torch.equal(cache.layers[0].keys[:, :, :5], prefix) and torch.equal(fork.layers[0].keys[:, :, :5], prefix)
    assert cache.get_seq_length() == 8 and fork.get_seq_length() == 8
    assert fork.layers[0].positions[0, 0].tolist() == list(range(8))
    assert cache.layers[0].positions[0, 0].tolist() == list(range(8))


def test_branches_leave_the_source_alone() -> None:
    cache = PositionedCache([None])
    feed(cache, 0, 4)
    before = cache.layers[0].keys.clone()
    futures = cache.branches(3)
    futures.reserve(3, 2)
    feed(futures, 4, 1, batch=3)
    assert futures.layers[0].keys.shape == (3, 2, 1, 4), "a branch stores its own tokens only"
    assert futures.get_seq_length() == 5
    assert torch.equal(cache.layers[0].keys, before) and cache.get_seq_length() == 4


def test_sliding_layer_keeps_window_minus_one_tokens_and_reserve_is_a_no_op() -> None:
    cache = PositionedCache([3])
    keys, _ = feed(cache, 0, 5)
    assert keys.shape[2] == 5, "the current pass sees everything it was given"
    assert cache.layers[0].positions[0, 0].tolist() == [3, 4]
    cache.reserve(1, 10)
    feed(cache, 5, 1)
    assert cache.layers[0].positions[0, 0].tolist() == [4, 5]


def test_allocated_bytes_count_reserved_room() -> None:
    cache = PositionedCache([None])
    feed(cache, 0, 4)
    assert cache.allocated_bytes() == 2 * 2 * 4 * 4 * 4
    cache.reserve(1, 6)
    assert cache.allocated_bytes() == 2 * 2 * 10 * 4 * 4


@given(
    key_positions=st.lists(st.integers(-1, 20), min_size=1, max_size=12),
    query_positions=st.lists(st.integers(0, 25), min_size=1, max_size=4),
    window=st.one_of(st.none(), st.integers(1, 8)),
)
@settings(max_examples=60, deadline=None)
def test_position_mask_matches_definition(key_positions, query_positions, window) -> None:
    kp = torch.tensor(key_positions).view(1, 1, -1)
    qp = torch.tensor(query_positions)
    mask = position_mask(kp, qp, window)[0, 0]
    for i, q in enumerate(query_positions):
        for j, k in enumerate(key_positions):
            expected = k != PADDING and k <= q and (window is None or q - k < window)
            assert bool(mask[i, j]) == expected


@given(
    counts=st.lists(st.lists(st.integers(0, 6), min_size=2, max_size=2), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_stack_left_pads_rows_and_keeps_each_rows_entries_and_mask(counts, seed) -> None:
    """B one-row caches (ragged heads) stacked: row b holds exactly its own entries, padding
    (position -1) only on the left, and the position mask of row b is the row's own."""
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for heads in counts:
        width = max(max(heads), 1)
        positions = torch.full((1, 2, width), PADDING)
        for g, k in enumerate(heads):
            positions[0, g, width - k :] = torch.randperm(20, generator=gen)[:k].sort().values
        cache = PositionedCache([None])
        cache.layers[0].set(
            torch.randn(1, 2, width, 4, generator=gen),
            torch.randn(1, 2, width, 4, generator=gen),
            positions,
            padded=True,
        )
        caches.append(cache)
    stacked = PositionedCache.stack(caches).layers[0]
    width = max(c.layers[0].keys.shape[2] for c in caches)
    assert stacked.keys.shape == (len(caches), 2, width, 4)
    queries = torch.tensor([[25]])
    for b, cache in enumerate(caches):
        own = cache.layers[0]
        pad = width - own.keys.shape[2]
        assert (stacked.positions[b, :, :pad] == PADDING).all()
        assert torch.equal(stacked.positions[b, :, pad:], own.positions[0])
        assert torch.equal(stacked.keys[b, :, pad:], own.keys[0]) and torch.equal(
            stacked.values[b, :, pad:], own.values[0]
        )
        mask = position_mask(stacked.positions[b : b + 1], queries, None)[..., pad:]
        assert torch.equal(mask, position_mask(own.positions, queries, None))


def test_position_mask_places_each_rows_queries_at_its_own_positions() -> None:
    keys = torch.tensor([[[PADDING, 0, 1, 2]], [[0, 1, 2, 3]]])
    queries = torch.tensor([[1], [3]])
    mask = position_mask(keys, queries, window=None)
    assert mask[:, 0, 0].tolist() == [[False, True, True, False], [True, True, True, True]]
    swapped = position_mask(keys.flip(0), queries.flip(0), window=None)
    assert torch.equal(swapped, mask.flip(0)), "permuting the rows permutes the mask"
