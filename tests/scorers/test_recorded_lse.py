"""The log-sum-exps a future's pass records change no score: every sampler, with and without them.

:func:`~lorekv.scorers.attention.prompt_attention_weights` reads a capture's recorded
normalisers (:attr:`~lorekv.trajectories.LayerCapture.lse`) instead of forming every logit
again. Each sampler's captures are scored as they come and with the recorded normalisers
stripped (the scorer then recomputes them from the keys): the scores must agree to float32
rounding. A sampler that changed which keys its queries see, or its response keys, without
dropping the recorded normalisers fails here; a new sampler must be added to the list.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_models import CharTokenizer, random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.samplers import SAMPLERS
from lorekv.scorers import SCORERS
from lorekv.trajectories import FutureMixture, Trajectories

FUTURES = {"num_futures": 2, "num_tokens": 3, "seed": 4}
SAMPLER_SPECS = {
    "temperature": FUTURES,
    "nucleus": {**FUTURES, "top_p": 0.9},
    "adaptive": {"num_tokens": 3, "seed": 4},
    "greedy": {"num_tokens": 3, "include_last_prompt_query": True},
    "oracle": {"token_ids": [[3, 9, 27], [5, 1, 40]]},
    "prompt_window": {"window": 5},
    "kvzip": {"chunk_size": 2048},
    "partial_kvzip": {"chunk_size": 12, "fraction": 0.5},
    "strided_kvzip": {"chunk_size": 12, "replay": 4},
    "questions": {"num_futures": 2, "question_tokens": 3, "answer_tokens": 2, "queries": "both"},
    "lookahead": {"draft_budget": 8, "num_tokens": 3, "window": 2, "draft_window": 4, "draft_pool_kernel": 3},
    "mixture": {"samplers": [{"name": "kvzip", "chunk_size": 16}, {"name": "temperature", **FUTURES}]},
}
RECORDED = {
    "temperature",
    "nucleus",
    "adaptive",
    "oracle",
    "kvzip",
    "partial_kvzip",
    "strided_kvzip",
    "questions",
    "mixture",
}
"""Samplers whose every query comes from a pass over the whole prompt: their captures carry the normalisers."""


def stripped(futures: Trajectories | FutureMixture) -> Trajectories | FutureMixture:
    if isinstance(futures, FutureMixture):
        return FutureMixture(tuple(stripped(part) for part in futures.parts))
    return replace(futures, layers=tuple(replace(layer, lse=None) for layer in futures.layers))


def recorded(futures: Trajectories | FutureMixture) -> bool:
    parts = futures.parts if isinstance(futures, FutureMixture) else (futures,)
    return all(layer.lse is not None for part in parts for layer in part.layers)


def test_every_sampler_is_covered() -> None:
    assert set(SAMPLER_SPECS) == set(SAMPLERS.names())


@pytest.fixture(scope="module")
def model():
    return tiny_llama(117, layers=2)


@pytest.mark.parametrize("name", sorted(SAMPLER_SPECS))
@pytest.mark.parametrize("scorer", ["attention_mass", "kvzip_plus"])
def test_recorded_normalisers_change_no_score(model, name: str, scorer: str) -> None:
    config = preset("kvzip_plus" if scorer == "kvzip_plus" else "kvzip", 6).override(
        {"sampler": {"name": name, **SAMPLER_SPECS[name]}, "scorer": {"name": scorer, "query_reduction": "mean"}}
    )
    pipeline = Pipeline.from_config(config)
    ids = random_ids(30, seed=317)
    batch = pipeline.prefill(model, ids, query_aware=False, tokenizer=CharTokenizer())
    futures = pipeline.sampler_for(False).futures_batch(batch)[0]
    assert recorded(futures) == (name in RECORDED)
    scorer_ = SCORERS.build(config.scorer)
    got, want = scorer_.score(futures), scorer_.score(stripped(futures))
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
