"""The kvzip and lookahead samplers' configs and model-free parts (the presets' fidelity tests
against the model's own attention are in tests/test_presets_samplers.py)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import CharTokenizer

from lorekv.samplers import SAMPLERS, KVzipConfig, KVzipSampler, PromptWindowConfig
from lorekv.samplers.kvzip import chunk_spans


@pytest.mark.parametrize(
    "spec,field",
    [
        ({"name": "kvzip", "chunk_size": 0}, "chunk_size"),
        ({"name": "kvzip", "overlap": -1}, "overlap"),
        ({"name": "kvzip", "sink": -1}, "sink"),
        ({"name": "kvzip", "suffix": 3}, "suffix"),
        ({"name": "lookahead"}, "draft_budget"),
        ({"name": "lookahead", "draft_budget": 0}, "draft_budget"),
        ({"name": "lookahead", "draft_budget": 8, "num_tokens": 0}, "num_tokens"),
        ({"name": "lookahead", "draft_budget": 8, "window": -1}, "window"),
        ({"name": "lookahead", "draft_budget": 8, "draft_window": 0}, "draft_window"),
        ({"name": "lookahead", "draft_budget": 8, "draft_pool_kernel": 4}, "draft_pool_kernel"),
        ({"name": "prompt_window", "window": "some"}, "window"),
    ],
)
def test_invalid_configs_name_the_parameter(spec: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SAMPLERS.build(spec)


def test_prompt_window_takes_all() -> None:
    sampler = SAMPLERS.build({"name": "prompt_window", "window": "all"})
    assert sampler.prefill_window == "all" and PromptWindowConfig().window == 32


def test_repeat_inputs_follow_kvpress() -> None:
    """Chunk 0: instruction + suffix + chunk; chunk i: continuation + previous chunk's last 8 + suffix + chunk."""
    tok = CharTokenizer()
    sampler = KVzipSampler(KVzipConfig(chunk_size=10, instruction="ab", continuation="c", suffix="|"))
    ids = torch.arange(100, 125).view(1, -1)
    parts = sampler.repeat_inputs(ids, tok)
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert [(s, e) for s, e, _ in parts] == [(0, 10), (10, 20), (20, 25)]
    assert parts[0][2].tolist() == enc("ab") + enc("|") + list(range(100, 110))
    assert parts[1][2].tolist() == enc("c") + list(range(102, 110)) + enc("|") + list(range(110, 120))
    assert parts[2][2].tolist() == enc("c") + list(range(112, 120)) + enc("|") + list(range(120, 125))


def test_chunk_spans_cover_sinks_chunk_and_own_causal_keys() -> None:
    spans = chunk_spans(n=30, start=10, end=20, sink=4, offset=7, length=3)
    keys = torch.arange(30 + 12)
    visible = ((keys >= spans[..., :1]) & (keys < spans[..., 1:])).any(dim=1)
    for t in range(3):
        expected = set(range(4)) | set(range(10, 20)) | set(range(37, 37 + t + 1))
        assert set(torch.nonzero(visible[t]).flatten().tolist()) == expected


def test_the_reconstructions_token_stats_are_computed_only_when_asked() -> None:
    """``token_stats=True`` gives the repeated tokens' log-probs under the model (as a teacher-forced
    future's); the default reports zeros, and the same queries, keys, and so the same kept sets."""
    from tiny_models import random_ids, tiny_llama

    from lorekv.pipeline import Pipeline
    from lorekv.presets import preset

    model, ids, tokenizer = tiny_llama(3), random_ids(30, seed=2), CharTokenizer()
    plain = Pipeline.from_config(preset("kvzip", 6))
    stats = Pipeline.from_config(preset("kvzip", 6).override({"sampler.token_stats": True}))
    rollout = plain.prefill(model, ids, query_aware=False, tokenizer=tokenizer)
    without, with_stats = (p.sampler.futures_batch(rollout)[0] for p in (plain, stats))
    assert bool((without.logprobs == 0).all()) and bool((without.entropies == 0).all())
    assert bool((with_stats.logprobs < 0).all()) and bool((with_stats.entropies > 0).all())
    forced = rollout.rows[0].teacher_force(with_stats.token_ids)
    torch.testing.assert_close(with_stats.logprobs, forced.logprobs, rtol=0, atol=1e-9)
    for a, b in zip(without.layers, with_stats.layers, strict=True):
        assert torch.equal(a.queries, b.queries) and torch.equal(a.response_keys, b.response_keys)
    kept = [p.compress(model, ids, query_aware=False, tokenizer=tokenizer).selection.mask() for p in (plain, stats)]
    assert torch.equal(kept[0], kept[1])
