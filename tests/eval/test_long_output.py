"""Fidelity along the full cache's output (:mod:`lorekv.eval.long_output`)."""

from __future__ import annotations

import torch
from tiny_models import random_ids, tiny_llama

from lorekv import DecodingSchedule, preset
from lorekv.eval.long_output import follow_full_output


def test_a_schedule_that_never_compresses_follows_the_full_cache_exactly() -> None:
    model = tiny_llama(3, context=512).eval()
    prompt = random_ids(16, seed=1)
    never = DecodingSchedule(preset("snapkv", 200, window=4), buffer=8)
    output, full, tracks = follow_full_output(model, prompt, {"never": never}, 40)
    track = tracks["never"]
    assert output.shape == (1, 40) and len(track.kl) == 40
    assert max(abs(k) for k in track.kl) < 1e-9 and all(track.agree) and track.identical_prefix == 40
    assert track.compressions == 0 and full.peak_bytes > 0


def test_the_identical_prefix_is_where_a_free_greedy_run_leaves_the_full_output() -> None:
    model = tiny_llama(4, context=512).eval()
    prompt = random_ids(24, seed=2)
    schedule = DecodingSchedule(preset("streaming_llm", 6, sink=1), buffer=2)
    output, full, tracks = follow_full_output(model, prompt, {"tight": schedule}, 60)
    track = tracks["tight"]
    prefix = track.identical_prefix
    assert 0 <= prefix < 60 and track.compressions > 10 and max(track.kl) > 0
    free = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), cache=schedule.cache(model), max_new_tokens=60,
        do_sample=False, eos_token_id=[], pad_token_id=0,
    )[:, 24:]  # fmt: skip
    assert torch.equal(free[:, :prefix], output[:, :prefix])
    assert free[0, prefix] != output[0, prefix]
    assert track.peak_bytes < full.peak_bytes
