"""A pipeline's query-agnostic parts: what ``compress(query_aware=False)`` runs when a pipeline
names them (LORE-KV's preset: KVzip's reconstruction, scorer and global threshold), and how
configs carry them."""

from __future__ import annotations

import pytest
import torch
import yaml
from tiny_models import CharTokenizer, random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf.decoding import decode
from lorekv.pipeline import AGNOSTIC, FAMILIES, PipelineConfig
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
"""The question futures LORE-KV's preset drew query-agnostically before issue 35."""
WITHOUT_AGNOSTIC = {part: None for part in AGNOSTIC}


def kept(compressed) -> list[list[list[int]]]:
    """Every (layer, KV head)'s kept candidates, sorted."""
    return [[sorted(head.tolist()) for head in layer] for layer in compressed.selection.indices]


def four_tuple(sampler: dict, budget: int) -> Pipeline:
    """LORE-KV's scorer, aggregator and policy with ``sampler`` in both modes, spelled out."""
    return Pipeline(sampler, "projected_loo", "mean", {"name": "uniform", "budget": budget})


def kvzip_tuple(budget: int) -> Pipeline:
    """KVzip's method as its docstring states it, spelled out: one reconstruction in chunks of
    2048, the max attention over its queries and the group's heads, one global threshold."""
    return Pipeline(
        {"name": "kvzip", "chunk_size": 2048},
        {"name": "attention_mass", "query_reduction": "max", "head_reduction": "max"},
        "mean",
        {"name": "global", "budget": budget},
    )


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"lore_kv"}))
def test_a_pipeline_without_one_serialises_as_the_four_parts(name: str) -> None:
    config = preset(name, 40)
    assert config.agnostic_parts == ()
    assert list(config.model_dump()) == list(FAMILIES)
    assert "agnostic_" not in config.to_yaml()
    assert config.for_mode(False) == config.for_mode(True) == config


def test_lore_kv_names_kvzips_parts_for_a_context_alone_and_round_trips() -> None:
    config = preset("lore_kv", 8, temperature=0.9, seed=3, num_futures=2, num_tokens=5, chunk_size=16)
    assert config.agnostic_parts == ("agnostic_sampler", "agnostic_scorer", "agnostic_policy")
    assert PipelineConfig.model_validate(yaml.safe_load(config.to_yaml())) == config
    assert PipelineConfig.model_validate_json(config.model_dump_json()) == config
    aware, agnostic = config.for_mode(True), config.for_mode(False)
    assert aware.agnostic_parts == agnostic.agnostic_parts == ()
    assert aware == four_tuple(config.sampler.model_dump(), 8).config
    assert agnostic == preset("kvzip", 8, chunk_size=16)
    assert aware.sampler.model_dump()["temperature"] == 0.9 and agnostic.sampler.chunk_size == 16
    assert Pipeline.from_config(config).config == config


def test_overrides_reach_the_agnostic_parts_and_a_new_part_serves_both_modes() -> None:
    config = preset("lore_kv", 8)
    assert config.override({"agnostic_sampler.chunk_size": 64}).agnostic_sampler.chunk_size == 64
    tuned = config.override({"sampler.num_futures": 2})
    assert tuned.sampler.num_futures == 2 and tuned.agnostic_parts == config.agnostic_parts
    assert config.override({"agnostic_sampler": None}).agnostic_parts == ("agnostic_scorer", "agnostic_policy")
    window = {"name": "prompt_window", "window": 8}
    for new_sampler in ({"sampler": window}, {"sampler.name": "nucleus"}):
        assert config.override(new_sampler).agnostic_parts == (), "a new sampler's futures, in both modes"
    both = config.override({"sampler": window, "agnostic_sampler": QUESTIONS})
    assert both.sampler.name == "prompt_window" and both.agnostic_sampler.name == "questions"
    assert both.agnostic_scorer == config.agnostic_scorer
    loo = config.override({"scorer": {"name": "projected_loo", "query_reduction": "max"}})
    assert loo.agnostic_scorer is None and loo.agnostic_policy == config.agnostic_policy
    assert config.override({"policy.name": "per_head"}).agnostic_policy is None
    assert config.override({"agnostic_scorer.query_reduction": "mean"}).scorer == config.scorer
    budget = config.override({"policy.budget": 64})
    assert budget.policy.budget == budget.agnostic_policy.budget == 64, "the method's budget, in both modes"
    as_config = preset("snapkv", 64).override({"agnostic_sampler": config.agnostic_sampler})
    assert as_config.agnostic_sampler == config.agnostic_sampler
    with pytest.raises(ValueError, match=r"'agnostic_scorer\.seed': this pipeline has no agnostic_scorer"):
        preset("snapkv", 64).override({"agnostic_scorer.seed": 1})
    with pytest.raises(ValueError, match="agnostic_sampler"):
        config.override({"agnostic_sampler.nope": 1})
    with pytest.raises(ValueError, match=r"agnostic_scorer\n.*unknown scorer .nope."):
        PipelineConfig.model_validate({**config.model_dump(), "agnostic_scorer": {"name": "nope"}})
    with pytest.raises(ValueError, match=r"agnostic_policy\.budget must equal policy\.budget \(8\), got 9"):
        config.override({"agnostic_policy.budget": 9})
    with pytest.raises(ValueError, match=r"agnostic_policy\.budget must equal policy\.budget \(8\), got 9"):
        Pipeline(*(config.model_dump()[f] for f in FAMILIES), agnostic_policy={"name": "global", "budget": 9})


def test_a_context_alone_is_compressed_with_kvzips_parts_a_prompt_with_lore_kvs() -> None:
    """The preset keeps exactly what KVzip's 4-tuple keeps query-agnostically (KVzip is checked
    against a brute-force reconstruction in test_kvzip.py), and exactly what the temperature
    futures with LORE-KV's scorer keep query-aware."""
    model, tok = tiny_llama(401, layers=3), CharTokenizer()
    ids = random_ids(N, seed=401)
    pipeline = Pipeline.from_config(preset("lore_kv", 9))
    alone = pipeline.compress(model, ids, query_aware=False, tokenizer=tok)
    assert kept(alone) == kept(kvzip_tuple(9).compress(model, ids, query_aware=False, tokenizer=tok))
    assert alone.method == preset("kvzip", 9).model_dump(mode="json")
    assert len({count for layer in alone.stats.kept for count in layer}) > 1, "one threshold, not B per head"
    continuing = four_tuple(preset("lore_kv", 9).sampler.model_dump(), 9)
    assert kept(alone) != kept(continuing.compress(model, ids, query_aware=False)), "the parts made no difference"
    with_question = pipeline.compress(model, ids)
    assert kept(with_question) == kept(continuing.compress(model, ids))
    assert len(with_question.stats.future_weights) == 4
    questions = Pipeline.from_config(preset("lore_kv", 9).override({**WITHOUT_AGNOSTIC, "agnostic_sampler": QUESTIONS}))
    asked = questions.compress(model, ids, query_aware=False, tokenizer=tok)
    assert kept(asked) == kept(four_tuple(QUESTIONS, 9).compress(model, ids, query_aware=False, tokenizer=tok))


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
    with pytest.raises(ValueError, match="the kvzip sampler tokenizes text of its own"):
        pipeline.compress(model, random_ids(N, seed=4), query_aware=False)
    long = random_ids(260, seed=4)
    pipeline.check_input(model, long, query_aware=True)  # 260 + 8 positions fit
    with pytest.raises(ValueError, match="kvzip future"):  # the repeat of 260 tokens after them does not
        pipeline.compress(model, long, query_aware=False, tokenizer=CharTokenizer())


def test_generate_with_a_question_compresses_the_context_with_the_agnostic_futures() -> None:
    model, tok = tiny_llama(405, layers=2), CharTokenizer()
    ids, question = random_ids(N, seed=405), random_ids(5, seed=406)
    pipeline = Pipeline.from_config(preset("lore_kv", 7))
    answer = pipeline.generate(model, ids, 3, question_ids=question, tokenizer=tok)
    compressed = kvzip_tuple(7).compress(model, ids, query_aware=False, tokenizer=tok)
    expected = decode(model, compressed, question, 3)
    assert torch.equal(answer.first_logits, expected.first_logits)
    assert torch.equal(answer.token_ids, expected.token_ids)
