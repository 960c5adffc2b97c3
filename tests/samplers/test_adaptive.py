"""The adaptive sampler: M_0 futures, and M_max only where the first M_0 disagree."""

from __future__ import annotations

import pytest
import torch
from recording import reference
from tiny_models import random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf import ModelRollout, evictable_layers, prepare
from lorekv.pipeline import prefill
from lorekv.samplers import SAMPLERS, AdaptiveConfig, AdaptiveSampler, TemperatureConfig, TemperatureSampler
from lorekv.samplers.adaptive import agree
from lorekv.trajectories import Trajectories, concat_futures

N = 30
EXACT = {"rtol": 1e-6, "atol": 1e-6}


def rollout(model, ids: torch.Tensor) -> ModelRollout:
    prepare(model)
    return ModelRollout(model, ids, evictable_layers(model), 0)


def adaptive(**options) -> AdaptiveSampler:
    return AdaptiveSampler(AdaptiveConfig(**options))


def assert_same_futures(a: Trajectories, b: Trajectories) -> None:
    assert a.token_ids.equal(b.token_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, **EXACT)
    for x, y in zip(a.layers, b.layers, strict=True):
        torch.testing.assert_close(x.queries, y.queries, **EXACT)
        torch.testing.assert_close(x.response_keys, y.response_keys, **EXACT)


@pytest.mark.parametrize(
    "spec,field,bound",
    [
        ({"num_futures": 3, "max_futures": 2}, "max_futures", ">= num_futures=3"),
        ({"num_futures": 0}, "num_futures", "greater than or equal to 1"),
        ({"max_futures": 0}, "max_futures", "greater than or equal to 1"),
        ({"temperature": 0.0}, "temperature", "greater than 0"),
        ({"draws": "antithetic"}, "draws", "'independent' or 'stratified'"),
    ],
)
def test_bad_configs_name_the_parameter_and_range(spec: dict, field: str, bound: str) -> None:
    with pytest.raises(ValueError) as error:
        SAMPLERS.build({"name": "adaptive", **spec})
    assert field in str(error.value) and bound in str(error.value)


def test_defaults_and_round_trip() -> None:
    config = AdaptiveConfig()
    assert (config.num_futures, config.max_futures, config.num_tokens, config.temperature) == (2, 8, 8, 1.0)
    assert SAMPLERS.parse(config.model_dump()) == config


def test_agreeing_futures_stop_after_the_first_round() -> None:
    """Near-greedy draws agree: the first round alone, exactly the temperature sampler's M_0."""
    model, ids = tiny_llama(401), random_ids(N, seed=1)
    options = {"num_futures": 3, "num_tokens": 4, "temperature": 1e-3, "seed": 5}
    futures = adaptive(**options, max_futures=7).sample(rollout(model, ids))
    assert futures.num_futures == 3 and agree(futures)
    assert_same_futures(futures, TemperatureSampler(TemperatureConfig(**options)).sample(rollout(model, ids)))


def test_disagreeing_futures_draw_up_to_the_most_each_as_the_model_computes_it() -> None:
    """Hot draws disagree: M_max futures, the first M_0 the temperature sampler's, and every
    future's log-probs, queries and keys those of the model's own forward over prompt + future."""
    model, ids = tiny_llama(402), random_ids(N, seed=2)
    options = {"num_futures": 2, "num_tokens": 3, "temperature": 3.0, "seed": 6}
    futures = adaptive(**options, max_futures=5).sample(rollout(model, ids))
    assert futures.num_futures == 5
    first = TemperatureSampler(TemperatureConfig(**options)).sample(rollout(model, ids))
    assert not agree(first)
    assert futures.token_ids[:2].equal(first.token_ids)
    for m in range(5):
        sequence = torch.cat([ids[0], futures.token_ids[m]]).view(1, -1)
        recs = reference(model, sequence)
        logp = torch.log_softmax(model(sequence, use_cache=False).logits[0].double(), dim=-1)
        expected = logp[torch.arange(N - 1, N + 2), futures.token_ids[m]]
        torch.testing.assert_close(futures.logprobs[m].double(), expected, atol=1e-6, rtol=0)
        for layer in futures.layers:
            torch.testing.assert_close(layer.queries[m], recs[layer.layer_idx]["query"][:, N:], **EXACT)
            torch.testing.assert_close(layer.response_keys[m], recs[layer.layer_idx]["key"][:, N:], **EXACT)


def test_a_single_round_never_draws_more() -> None:
    model, ids = tiny_llama(403), random_ids(N, seed=3)
    futures = adaptive(num_futures=3, max_futures=3, temperature=3.0).sample(rollout(model, ids))
    assert futures.num_futures == 3 and not agree(futures)


def test_batch_rows_equal_each_row_alone_whether_they_stop_or_not() -> None:
    """A left-padded batch where some rows' first futures agree and others' do not: each row's
    futures are exactly its futures alone (a stopped row's discarded second round changes nothing)."""
    model = tiny_llama(404)
    sampler = adaptive(num_futures=2, max_futures=4, num_tokens=1, temperature=0.05, seed=1)
    prompts = [random_ids(N - pad, seed=10 + i) for i, pad in enumerate((0, 3, 5, 2, 0, 4))]
    batch = torch.cat([torch.cat([torch.zeros(1, N - p.shape[1], dtype=torch.long), p], dim=1) for p in prompts])
    mask = (torch.arange(N) >= torch.tensor([N - p.shape[1] for p in prompts]).unsqueeze(1)).long()
    together = sampler.futures_batch(prefill(model, batch, [sampler], attention_mask=mask, query_aware=False))
    counts = [f.num_futures for f in together]
    assert set(counts) == {2, 4}, counts  # both cases occur
    for ids, got in zip(prompts, together, strict=True):
        alone = sampler.futures(prefill(model, ids, [sampler], query_aware=False).rows[0])
        assert_same_futures(got, alone)


def test_the_pipeline_keeps_the_exact_budget_with_adaptive_futures() -> None:
    model, ids = tiny_llama(405), random_ids(N, seed=5)
    config = preset("lore_kv", 6).override({"sampler": {"name": "adaptive", "temperature": 3.0}})
    compressed = Pipeline.from_config(config).compress(model, ids)
    assert len(compressed.stats.future_weights) == 8
    assert all(count == 6 for row in compressed.stats.kept for count in row)


def test_concat_futures_rejects_parts_of_other_shapes() -> None:
    model, ids = tiny_llama(406), random_ids(N, seed=6)
    short = TemperatureSampler(TemperatureConfig(num_tokens=2)).sample(rollout(model, ids))
    long = TemperatureSampler(TemperatureConfig(num_tokens=3)).sample(rollout(model, ids))
    with pytest.raises(ValueError, match="one shape"):
        concat_futures([short, long])
    both = concat_futures([short, short])
    assert both.num_futures == 8 and both.token_ids[4:].equal(short.token_ids)
