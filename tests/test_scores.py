"""``Selection``'s derived tensors (mask, padded rectangle, counts): values, and the device they live on.

The ``meta`` device stands in for an accelerator: it exercises a selection whose indices are
not on the CPU without needing a GPU (building a CPU mask and indexing it with device indices
fails on a GPU and silently writes nothing with meta indices).
"""

from __future__ import annotations

import torch

from lorekv.scores import Selection

KEPT = [[[0, 2, 5], [1]], [[], [3, 4]]]
N = 6


def selection(device: str) -> Selection:
    indices = tuple(tuple(torch.tensor(h, dtype=torch.long, device=device) for h in layer) for layer in KEPT)
    return Selection(indices=indices, layer_indices=(3, 7), num_tokens=N)


def test_values_on_the_cpu() -> None:
    sel = selection("cpu")
    expected = torch.zeros(2, 2, N, dtype=torch.bool)
    for layer, heads in enumerate(KEPT):
        for g, head in enumerate(heads):
            expected[layer, g, head] = True
    assert torch.equal(sel.mask(), expected)
    assert sel.counts().tolist() == [[3, 1], [0, 2]]
    idx, valid = sel.padded(0)
    assert idx.tolist() == [[0, 2, 5], [1, 1, 1]]
    assert valid.tolist() == [[True, True, True], [True, False, False]]
    idx, valid = sel.padded(1)
    assert idx.tolist() == [[0, 0], [3, 4]]
    assert valid.tolist() == [[False, False], [True, True]]


def test_mask_lives_on_the_indices_device() -> None:
    mask = selection("meta").mask()
    assert mask.device == torch.device("meta")
    assert mask.shape == (2, 2, N) and mask.dtype == torch.bool


def test_padded_lives_on_the_indices_device() -> None:
    sel = selection("meta")
    for layer in (0, 1):
        idx, valid = sel.padded(layer)
        assert idx.device == valid.device == torch.device("meta")
        assert idx.shape == valid.shape == (2, max(len(h) for h in KEPT[layer]))
        assert idx.dtype == torch.long and valid.dtype == torch.bool


def test_counts_of_device_indices_are_cpu_bookkeeping() -> None:
    counts = selection("meta").counts()
    assert counts.device == torch.device("cpu") and counts.tolist() == [[3, 1], [0, 2]]


def test_device_is_the_indices_device() -> None:
    assert selection("meta").device == torch.device("meta")
    assert selection("cpu").device == torch.device("cpu")


def test_empty_selection_is_on_the_cpu() -> None:
    assert Selection(indices=(), layer_indices=(), num_tokens=4).device == torch.device("cpu")
