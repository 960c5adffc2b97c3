"""A pipeline's query-agnostic sampler: what ``compress(query_aware=False)`` draws when a
pipeline names one (LORE-KV's preset: question futures), and how configs carry it."""

from __future__ import annotations

import pytest
import torch
import yaml
from tiny_models import CharTokenizer, random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf.decoding import decode
from lorekv.pipeline import FAMILIES, PipelineConfig
from lorekv.presets import PRESETS

N = 40
QUESTIONS = {
    "name": "questions",
    "num_futures": 4,
    "question_tokens": 16,
    "answer_tokens": 8,
    "temperature": 0.7,
    "seed": 0,
    "queries": "both",
}
"""LORE-KV's query-agnostic futures, as its docstring states them."""


def kept(compressed) -> list[list[list[int]]]:
    """Every (layer, KV head)'s kept candidates, sorted."""
    return [[sorted(head.tolist()) for head in layer] for layer in compressed.selection.indices]


def four_tuple(sampler: dict, budget: int) -> Pipeline:
    """LORE-KV's scorer, aggregator and policy with ``sampler`` in both modes, spelled out."""
    return Pipeline(sampler, "projected_loo", "mean", {"name": "uniform", "budget": budget})


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"lore_kv"}))
def test_a_pipeline_without_one_serialises_as_the_four_parts(name: str) -> None:
    config = preset(name, 40)
    assert config.agnostic_sampler is None
    assert list(config.model_dump()) == list(FAMILIES)
    assert "agnostic_sampler" not in config.to_yaml()
    assert config.for_mode(False) == config.for_mode(True) == config


def test_lore_kv_names_question_futures_for_a_context_alone_and_round_trips() -> None:
    config = preset("lore_kv", 8, temperature=0.9, seed=3, num_futures=2, num_tokens=5)
    dumped = config.agnostic_sampler.model_dump()
    assert {key: dumped[key] for key in QUESTIONS} == {
        **QUESTIONS,
        "temperature": 0.9,
        "seed": 3,
        "num_futures": 2,
        "answer_tokens": 5,
    }
    assert PipelineConfig.model_validate(yaml.safe_load(config.to_yaml())) == config
    assert PipelineConfig.model_validate_json(config.model_dump_json()) == config
    aware, agnostic = config.for_mode(True), config.for_mode(False)
    assert aware.sampler == config.sampler and agnostic.sampler == config.agnostic_sampler
    assert aware.agnostic_sampler is None and agnostic.agnostic_sampler is None
    for mode in (aware, agnostic):
        assert (mode.scorer, mode.aggregator, mode.policy) == (config.scorer, config.aggregator, config.policy)
    assert Pipeline.from_config(config).config == config


def test_overrides_reach_the_agnostic_sampler_and_a_new_sampler_serves_both_modes() -> None:
    config = preset("lore_kv", 8)
    assert config.override({"agnostic_sampler.num_futures": 2}).agnostic_sampler.num_futures == 2
    tuned = config.override({"sampler.num_futures": 2})
    assert tuned.sampler.num_futures == 2 and tuned.agnostic_sampler == config.agnostic_sampler
    assert config.override({"agnostic_sampler": None}).agnostic_sampler is None
    window = {"name": "prompt_window", "window": 8}
    assert config.override({"sampler": window}).agnostic_sampler is None
    assert config.override({"sampler.name": "nucleus"}).agnostic_sampler is None
    both = config.override({"sampler": window, "agnostic_sampler.num_futures": 2})
    assert both.sampler.name == "prompt_window" and both.agnostic_sampler.num_futures == 2
    assert config.override({"agnostic_sampler": window}).agnostic_sampler.name == "prompt_window"
    as_config = preset("snapkv", 64).override({"agnostic_sampler": config.agnostic_sampler})
    assert as_config.agnostic_sampler == config.agnostic_sampler
    with pytest.raises(ValueError, match=r"'agnostic_sampler\.seed': this pipeline has no agnostic_sampler"):
        preset("snapkv", 64).override({"agnostic_sampler.seed": 1})
    with pytest.raises(ValueError, match="agnostic_sampler"):
        config.override({"agnostic_sampler.nope": 1})
    with pytest.raises(ValueError, match=r"agnostic_sampler\n.*unknown sampler .nope."):
        PipelineConfig.model_validate({**config.model_dump(), "agnostic_sampler": {"name": "nope"}})


def test_a_context_alone_is_compressed_with_question_futures_a_prompt_with_the_sampler() -> None:
    """The preset keeps exactly what its 4-tuple with the question futures keeps query-agnostically
    (those futures are checked against the model's own forward in test_query_agnostic.py), and
    exactly what the temperature futures keep query-aware."""
    model, tok = tiny_llama(401, layers=3), CharTokenizer()
    ids = random_ids(N, seed=401)
    pipeline = Pipeline.from_config(preset("lore_kv", 9))
    alone = pipeline.compress(model, ids, query_aware=False, tokenizer=tok)
    assert kept(alone) == kept(four_tuple(QUESTIONS, 9).compress(model, ids, query_aware=False, tokenizer=tok))
    continuing = four_tuple(preset("lore_kv", 9).sampler.model_dump(), 9)
    assert kept(alone) != kept(continuing.compress(model, ids, query_aware=False)), "the futures made no difference"
    with_question = pipeline.compress(model, ids)
    assert kept(with_question) == kept(continuing.compress(model, ids))
    assert len(alone.stats.future_weights) == len(with_question.stats.future_weights) == 4


def test_a_batch_of_contexts_keeps_what_each_keeps_alone() -> None:
    model, tok = tiny_llama(402, layers=2), CharTokenizer()
    rows = [random_ids(N, seed=402), random_ids(N - 7, seed=403)]
    ids = torch.zeros(2, N, dtype=torch.long)
    mask = torch.zeros(2, N, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, N - row.shape[1] :], mask[i, N - row.shape[1] :] = row[0], 1
    pipeline = Pipeline.from_config(preset("lore_kv", 6))
    batch = pipeline.compress(model, ids, attention_mask=mask, query_aware=False, tokenizer=tok)
    for i, row in enumerate(rows):
        alone = pipeline.compress(model, row, query_aware=False, tokenizer=tok)
        assert kept(batch.rows([i])) == kept(alone)


def test_only_the_query_agnostic_futures_need_the_tokenizer_and_their_script_must_fit() -> None:
    model = tiny_llama(404)  # 512 positions
    pipeline = Pipeline.from_config(preset("lore_kv", 8))
    pipeline.compress(model, random_ids(N, seed=4))  # the temperature futures feed no text

    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran before the input was refused")

    model.forward = forbidden
    with pytest.raises(ValueError, match="the questions sampler tokenizes text of its own"):
        pipeline.compress(model, random_ids(N, seed=4), query_aware=False)
    long = Pipeline.from_config(preset("lore_kv", 8).override({"agnostic_sampler.question_tokens": 480}))
    long.check_input(model, random_ids(N, seed=4), query_aware=True)  # 40 + 8 positions fit
    with pytest.raises(ValueError, match="questions future"):
        long.compress(model, random_ids(N, seed=4), query_aware=False, tokenizer=CharTokenizer())


def test_generate_with_a_question_compresses_the_context_with_the_agnostic_futures() -> None:
    model, tok = tiny_llama(405, layers=2), CharTokenizer()
    ids, question = random_ids(N, seed=405), random_ids(5, seed=406)
    pipeline = Pipeline.from_config(preset("lore_kv", 7))
    answer = pipeline.generate(model, ids, 3, question_ids=question, tokenizer=tok)
    compressed = four_tuple(QUESTIONS, 7).compress(model, ids, query_aware=False, tokenizer=tok)
    expected = decode(model, compressed, question, 3)
    assert torch.equal(answer.first_logits, expected.first_logits)
    assert torch.equal(answer.token_ids, expected.token_ids)
