"""Decoding after eviction, compared by logits token by token against an independent reference.

The reference is the plain model with transformers' ``DynamicCache`` holding every prompt
entry at its natural position, and an attention function (registered for the test) that hides
the evicted entries of each layer and KV head with a boolean mask before SDPA. It shares no
code with lorekv's positioned cache, gather or position masks, so it pins the positions of
decoded tokens, the re-fed last prompt token, and the masking of padded ragged heads in
one-token decode steps.
"""

from __future__ import annotations

import masked_reference as masked
import pytest
import torch
import torch.nn.functional as F
from masked_reference import keep_masks, visible
from tiny_models import random_ids, tiny_gemma3, tiny_llama

from lorekv import Pipeline, decode


def masked_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA over a contiguous cache with the evicted entries hidden (float64 throughout, unlike
    the eager reference's float32 rounding, so logits compare to 1e-9)."""
    group = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(
        query,
        key.repeat_interleave(group, dim=1),
        value.repeat_interleave(group, dim=1),
        attn_mask=visible(module, query, key, **kwargs).repeat_interleave(group, dim=0).unsqueeze(0),
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None


def reference_logits(model, prompt: torch.Tensor, keep: dict[int, torch.Tensor], fed: list[torch.Tensor]) -> list:
    return masked.reference_logits(model, prompt, keep, fed, attention=masked_sdpa)


class Recorder:
    """A greedy token rule that remembers the logits it chose from."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        self.seen.append(logits[0].clone())
        return logits.argmax(dim=-1)


CASES = [
    pytest.param(lambda: tiny_llama(31, layers=2), {"name": "per_head", "budget": 6, "alpha": 0.0}, id="llama-ragged"),
    pytest.param(
        lambda: tiny_llama(32, layers=3), {"name": "per_layer", "budget": 6, "beta": 3.0}, id="llama-per-layer"
    ),
    pytest.param(lambda: tiny_gemma3(33, window=64), {"name": "uniform", "budget": 5, "sink": 1}, id="gemma3-hybrid"),
]


@pytest.mark.parametrize("make,policy", CASES)
def test_query_aware_decoding_equals_masked_full_cache_by_logits(make, policy) -> None:
    model = make()
    ids = random_ids(28, seed=41)
    n = ids.shape[1]
    pipeline = Pipeline({"name": "temperature", "num_futures": 2, "num_tokens": 3}, "projected_loo", "mean", policy)
    compressed = pipeline.compress(model, ids)
    if policy["name"] == "per_head":
        counts = compressed.selection.counts()
        assert (counts != counts[:, :1]).any(), "test needs ragged heads (padding in decode steps)"
    rule = Recorder()
    result = decode(model, compressed, max_new_tokens=6, rule=rule)
    assert len(rule.seen) == 6 == len(result.token_ids)
    fed = [ids[:, n - 1 :]] + [result.token_ids[i].view(1, 1) for i in range(5)]
    expected = reference_logits(model, ids[:, : n - 1], keep_masks(compressed), fed)
    for step, (got, want) in enumerate(zip(rule.seen, expected, strict=True)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m, s=step: f"step {s}: {m}")
    torch.testing.assert_close(result.first_logits, expected[0], rtol=1e-9, atol=1e-9)


def test_query_agnostic_decoding_equals_masked_full_cache_by_logits() -> None:
    model = tiny_llama(34, layers=2)
    context, question = random_ids(24, seed=42), random_ids(5, seed=43)
    policy = {"name": "per_head", "budget": 5, "alpha": 0.0}
    compressed = Pipeline("greedy", "attention_mass", "mean", policy).compress(model, context, query_aware=False)
    rule = Recorder()
    result = decode(model, compressed, question, max_new_tokens=4, rule=rule)
    fed = [question] + [result.token_ids[i].view(1, 1) for i in range(3)]
    expected = reference_logits(model, context, keep_masks(compressed), fed)
    for got, want in zip(rule.seen, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_decoded_positions_matter_to_the_logits() -> None:
    """Sanity check of the reference: the same tokens at shifted positions give other logits."""
    model = tiny_llama(35, layers=2)
    ids = random_ids(20, seed=44)
    keep = {0: torch.ones(2, 19, dtype=torch.bool), 1: torch.ones(2, 19, dtype=torch.bool)}
    a = reference_logits(model, ids[:, :19], keep, [ids[:, 19:], ids[:, :1]])
    b = reference_logits(model, ids[:, :18], {k: v[:, :18] for k, v in keep.items()}, [ids[:, 19:], ids[:, :1]])
    assert not torch.allclose(a[1], b[1], atol=1e-6)


def test_decoding_stops_at_end_of_sequence_and_keeps_it() -> None:
    """The answer ends with the eos token that stopped it; without eos it runs to max_new_tokens."""
    from lorekv import generate_full

    model = tiny_llama(36, layers=2)
    ids = random_ids(20, seed=45)
    free = generate_full(model, ids, max_new_tokens=8).token_ids
    assert len(free) == 8
    stop = int(free[3])
    first = free.tolist().index(stop)
    stopped = generate_full(model, ids, max_new_tokens=8, eos_token_id=[stop, 10_000]).token_ids
    assert stopped.tolist() == free[: first + 1].tolist(), "stops at the first eos and keeps it"
