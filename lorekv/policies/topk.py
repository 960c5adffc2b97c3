"""Selection helpers shared by the policies: protected tokens, normalisation, stable top-k.

Every policy ranks tokens by a *priority*: the scores (optionally normalised per head) with
+inf on the protected tokens, so that protected tokens win every top-k and are counted
inside the budget. Ties are broken by a stable sort: the lower index wins.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from lorekv.scores import Scores, Selection


def protected_count(num_tokens: int, sink: int, recent: int) -> int:
    """p = |first ``sink`` ∪ last ``recent`` of n candidates| = min(sink + recent, n)."""
    return min(sink + recent, num_tokens)


def protected_mask(num_tokens: int, sink: int, recent: int, device: torch.device | None = None) -> torch.Tensor:
    """(n,) bool: True on the first ``sink`` and the last ``recent`` candidates."""
    position = torch.arange(num_tokens, device=device)
    return (position < sink) | (position >= num_tokens - recent)


def normalise_per_head(values: torch.Tensor) -> torch.Tensor:
    """(..., n) v_j / sum_i v_i per head; a head whose scores sum to 0 becomes uniform 1/n."""
    total = values.sum(dim=-1, keepdim=True)
    uniform = torch.full_like(values, 1.0 / values.shape[-1])
    return torch.where(total > 0, values / torch.where(total > 0, total, torch.ones_like(total)), uniform)


def priority(values: torch.Tensor, sink: int, recent: int, *, normalize: bool = False) -> torch.Tensor:
    """(L, G, n) ranking key, at least float32: the (normalised) scores, +inf on protected tokens."""
    key = values.to(torch.promote_types(values.dtype, torch.float32))
    if normalize:
        key = normalise_per_head(key)
    protected = protected_mask(key.shape[-1], sink, recent, key.device)
    return key.masked_fill(protected, math.inf)


def top_k_mask(key: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """(..., n) bool: the ``k`` largest entries of each row of ``key``.

    ``k`` is an int or a long tensor broadcastable to ``key.shape[:-1]`` (per-row budgets).
    Ties go to the lower index (stable sort), so the result is deterministic.
    """
    n = key.shape[-1]
    order = torch.argsort(key, dim=-1, descending=True, stable=True)
    position = torch.arange(n, device=key.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, position)
    if isinstance(k, int):
        return rank < k
    return rank < k.to(key.device).unsqueeze(-1)


def selection_from_mask(mask: torch.Tensor, layer_indices: tuple[int, ...]) -> Selection:
    """A :class:`Selection` from a (L, G, n) keep mask (indices on the mask's device)."""
    num_layers, num_heads, n = mask.shape
    counts = mask.sum(dim=-1).flatten().tolist()
    tokens = mask.nonzero()[:, 2].split(counts)
    indices = tuple(tuple(tokens[layer * num_heads : (layer + 1) * num_heads]) for layer in range(num_layers))
    return Selection(indices=indices, layer_indices=tuple(layer_indices), num_tokens=n)


def keep_all(scores: Scores) -> Selection:
    """The identity selection: every candidate of every head."""
    mask = torch.ones(scores.values.shape, dtype=torch.bool, device=scores.values.device)
    return selection_from_mask(mask, scores.layer_indices)


def largest_remainder(quotas: list[Fraction], total: int) -> list[int]:
    """Integers summing to ``total`` from exact quotas summing to ``total``.

    Each quota is rounded down, then the leftover units go to the largest fractional
    parts (ties: lower index first). A non-increasing sequence stays non-increasing.
    """
    floors = [math.floor(q) for q in quotas]
    left = total - sum(floors)
    if not 0 <= left <= len(quotas):
        raise ValueError(f"quotas sum to {sum(quotas)}, not to the total {total}")
    by_remainder = sorted(range(len(quotas)), key=lambda i: (floors[i] - quotas[i], i))
    for i in by_remainder[:left]:
        floors[i] += 1
    return floors


def cap_and_redistribute(budgets: list[int], cap: int) -> list[int]:
    """Cap every budget at ``cap`` and hand the excess, evenly, to the budgets below the cap.

    Repeats until nothing exceeds the cap, so the total is min(sum(budgets), len * cap). An
    uneven remainder goes to the lower indices first, so a non-increasing sequence stays
    non-increasing.
    """
    out = list(budgets)
    while True:
        excess = sum(max(b - cap, 0) for b in out)
        out = [min(b, cap) for b in out]
        below = [i for i, b in enumerate(out) if b < cap]
        if excess == 0 or not below:
            return out
        share, extra = divmod(excess, len(below))
        for rank, i in enumerate(below):
            out[i] += share + (1 if rank < extra else 0)
