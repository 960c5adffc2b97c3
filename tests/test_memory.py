"""Memory of compression: nothing allocates the prompt's KV per future, nor per-query tensors
that grow with the futures and their tokens.

Measured with :class:`lorekv.cost.measure.PeakMemory` (torch's own CPU allocations) around the
phases after the prefill, on a float64 Llama at n = 2048, for few short futures and for many
long ones. What may grow with M * T is what the formulas keep: the futures' own KV and queries,
and the per-future scores (M, L, G, n). What must not: a copy of the prompt's KV per future
(sampling), or (M, H, T, n) per-query tensors (scoring; :data:`lorekv.scorers.base.SCORE_CHUNK`
bounds them). The bounds below sit well between the two.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

import lorekv.scorers.base as scorer_base
from lorekv.cost.measure import PeakMemory
from lorekv.pipeline import Pipeline
from lorekv.presets import preset

N = 2048


@pytest.fixture(scope="module")
def model():
    return tiny_llama(31, context=N + 64)


def phase_peaks(model, num_futures: int, num_tokens: int) -> dict[str, int]:
    pipeline = Pipeline.from_config(preset("lore_kv", 64, num_futures=num_futures, num_tokens=num_tokens))
    ids = torch.randint(0, model.config.vocab_size, (1, N), generator=torch.Generator().manual_seed(5))
    batch = pipeline.prefill(model, ids)
    with PeakMemory() as sampling:
        futures = pipeline.sampler.futures_batch(batch)
    with PeakMemory() as scoring:
        pipeline.score(futures[0], batch.rows[0].candidates)
    return {"sampling": sampling.peak, "scoring": scoring.peak}


def test_compression_allocates_no_prompt_kv_per_future_and_no_growing_per_query_tensors(model, monkeypatch) -> None:
    config = model.config
    layers, kv_heads, heads = config.num_hidden_layers, config.num_key_value_heads, config.num_attention_heads
    head_dim, item = config.hidden_size // heads, 8  # float64
    rows = 4
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", rows * heads * (N + 32))
    few, many = (2, 4), (16, 32)
    small, large = phase_peaks(model, *few), phase_peaks(model, *many)

    prompt_kv_per_future = 2 * layers * kv_heads * N * head_dim * item
    extra_futures = many[0] - few[0]
    assert large["sampling"] - small["sampling"] < 0.25 * extra_futures * prompt_kv_per_future, (
        f"sampling grew by {large['sampling'] - small['sampling']} bytes from M={few[0]} to M={many[0]}: "
        f"the prompt's KV ({prompt_kv_per_future} bytes) is copied per future"
    )
    per_query_tensor = many[0] * many[1] * heads * (N + many[1]) * item  # one (M, H, T, n+R) tensor
    assert large["scoring"] < 0.25 * per_query_tensor, (
        f"scoring peaked at {large['scoring']} bytes with M*T={many[0] * many[1]}: per-query tensors "
        f"of {per_query_tensor} bytes are not chunked"
    )
