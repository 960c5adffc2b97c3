"""Batches: a left-padded batch of prompts of different lengths is compressed and answered
row by row exactly as each prompt alone (issue 19): permutations, the cache's bytes, rows of a
compressed batch, ``model.generate``'s eos per row and the refusals.

The row-by-row oracle itself, for every preset, both modes and both tiny models at the edges of
ragged batches, is ``tests/test_batch_rows.py``.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from tiny_models import CharTokenizer, random_ids, surrogate_for, tiny_gemma3, tiny_llama

from lorekv.hf import decode_batch, prepare
from lorekv.pipeline import Pipeline
from lorekv.presets import PRESETS, preset

LENGTHS = (34, 12, 26, 20)
"""Four prompts: the longest first, one much shorter."""


@pytest.fixture(scope="module")
def models():
    return {"llama": prepare(tiny_llama(71, layers=2)), "gemma3": prepare(tiny_gemma3(72, window=6))}


def left_padded(rows: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, N) ids and mask, each row's tokens at the right end."""
    width = max(r.shape[1] for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[1] :] = r[0]
        mask[i, width - r.shape[1] :] = 1
    return ids, mask


def kept_sets(selection) -> list[list[int]]:
    return [sorted(head.tolist()) for heads in selection.indices for head in heads]


def pipeline_for(name: str, model: torch.nn.Module | None = None) -> Pipeline:
    parameters = inspect.signature(PRESETS[name]).parameters
    options: dict[str, Any] = {key: 4 for key in ("window", "draft_window") if key in parameters}
    if "surrogate" in parameters:  # a fitted file is refused by every other model
        options["surrogate"] = surrogate_for(model)
    return Pipeline.from_config(preset(name, 8, **options))


PROMPTS = [random_ids(n, seed=100 + i) for i, n in enumerate(LENGTHS)]
QUESTIONS = [random_ids(q, seed=200 + i) for i, q in enumerate((3, 1, 2, 3))]


@pytest.mark.parametrize("query_aware", [True, False], ids=["query-aware", "query-agnostic"])
def test_the_batch_cache_holds_what_its_rows_hold(models, query_aware: bool) -> None:
    """The stacked cache's kept and held bytes (its sliding layers left-padded, capped at their
    window - 1 once the pending token is fed) are the sum of its rows' own."""
    ids, mask = left_padded([*PROMPTS, random_ids(4, seed=7)])  # the last row is shorter than the window
    batch = Pipeline.from_config(preset("lore_kv", 2)).compress(
        models["gemma3"], ids, attention_mask=mask, query_aware=query_aware, tokenizer=CharTokenizer()
    )
    assert any(layer.padded and layer.window is not None for layer in batch.layers), "a padded sliding layer"
    assert batch.kept_bytes() == sum(stats.bytes_kept for stats in batch.row_stats)
    assert batch.held_bytes(int(query_aware)) == sum(stats.bytes_held for stats in batch.row_stats)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_permuting_the_rows_permutes_the_kept_sets(models, name: str) -> None:
    model = models["gemma3"]
    pipeline = pipeline_for(name, model)
    order = [2, 0, 3, 1]
    ids, mask = left_padded(PROMPTS)
    permuted_ids, permuted_mask = left_padded([PROMPTS[i] for i in order])
    batch = pipeline.compress(model, ids, attention_mask=mask, tokenizer=CharTokenizer())
    permuted = pipeline.compress(model, permuted_ids, attention_mask=permuted_mask, tokenizer=CharTokenizer())
    for slot, row in enumerate(order):
        assert kept_sets(permuted.selections[slot]) == kept_sets(batch.selections[row])


def test_a_rows_sampled_futures_do_not_depend_on_its_batch(models) -> None:
    model, pipeline = models["llama"], pipeline_for("lore_kv")
    ids, mask = left_padded(PROMPTS[:2])
    first = pipeline.prefill(model, ids, attention_mask=mask)
    ids, mask = left_padded([PROMPTS[2], PROMPTS[0], PROMPTS[3]])
    second = pipeline.prefill(model, ids, attention_mask=mask)
    a = pipeline.sampler.futures_batch(first)[0]
    b = pipeline.sampler.futures_batch(second)[1]
    assert a.token_ids.shape == (4, 8) and torch.equal(a.token_ids, b.token_ids)
    torch.testing.assert_close(a.layers[0].queries, b.layers[0].queries, rtol=0, atol=1e-9)


def test_model_generate_continues_a_batch_and_stops_each_row_at_its_own_eos(models) -> None:
    model, pipeline = models["llama"], pipeline_for("snapkv")
    ids, mask = left_padded(PROMPTS)
    compressed = pipeline.compress(model, ids, attention_mask=mask)
    alone = [model.generate(p, cache=pipeline.compress(model, p), max_new_tokens=6, do_sample=False) for p in PROMPTS]
    eos = int(alone[1][0, LENGTHS[1]])  # row 1 stops at once
    assert any(int(a[0, n]) != eos for a, n in zip(alone, LENGTHS, strict=True)), "another row goes on"
    out = model.generate(
        ids, attention_mask=mask, cache=compressed.fork(), max_new_tokens=6, do_sample=False, eos_token_id=eos,
        pad_token_id=0,
    )  # fmt: skip
    width = ids.shape[1]
    for i, (single, n) in enumerate(zip(alone, LENGTHS, strict=True)):
        want = single[0, n:].tolist()
        if eos in want:
            want = want[: want.index(eos) + 1]
        assert out[i, width : width + len(want)].tolist() == want, f"row {i}"
        assert set(out[i, width + len(want) :].tolist()) <= {0}, "a finished row only pads"


def test_rows_of_a_compressed_batch_answer_as_in_the_batch(models) -> None:
    model, pipeline = models["gemma3"], pipeline_for("lore_kv")
    ids, mask = left_padded(PROMPTS)
    compressed = pipeline.compress(model, ids, attention_mask=mask, query_aware=False, tokenizer=CharTokenizer())
    questions, question_mask = left_padded(QUESTIONS)
    everyone = decode_batch(model, compressed, questions, question_mask, 2)
    some = decode_batch(model, compressed.rows([3, 1]), *left_padded([QUESTIONS[3], QUESTIONS[1]]), 2)
    for got, row in zip(some, [3, 1], strict=True):
        torch.testing.assert_close(got.first_logits, everyone[row].first_logits, rtol=0, atol=1e-9)
    assert compressed.rows([3, 1]).row_stats == (compressed.row_stats[3], compressed.row_stats[1])
    with pytest.raises(ValueError, match="row_stats"):
        compressed.stats  # noqa: B018


def bad_batches():
    ids, mask = left_padded(PROMPTS[:3])
    right = mask.clone()
    right[1] = mask[1].flip(0)
    empty = mask.clone()
    empty[2] = 0
    short_ids, short_mask = left_padded([PROMPTS[0], random_ids(3, seed=9)])
    long_ids, long_mask = left_padded([random_ids(20, seed=3), random_ids(510, seed=4)])
    return [
        pytest.param(ids, right, "row 1 is not left padding", id="right-padding"),
        pytest.param(ids, empty, "row 2 is all padding", id="all-padding"),
        pytest.param(ids, mask[:, 1:], r"shape of input_ids", id="mask-shape"),
        pytest.param(short_ids, short_mask, "row 1: window must be <= the prompt length 3", id="row-too-short"),
        pytest.param(long_ids, long_mask, "row 1: .*context", id="row-over-the-context"),
    ]


@pytest.mark.parametrize("ids,mask,match", bad_batches())
def test_bad_batches_are_refused_before_model_work_naming_the_row(models, ids, mask, match) -> None:
    model = models["llama"]
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=match):
            pipeline_for("snapkv").generate_batch(model, ids, 4, attention_mask=mask)
    finally:
        handle.remove()
    assert not calls


def test_generate_refuses_a_mask_that_does_not_continue_the_compressed_batch(models) -> None:
    model, pipeline = models["llama"], pipeline_for("snapkv")
    ids, mask = left_padded(PROMPTS[:3])
    compressed = pipeline.compress(model, ids, attention_mask=mask, query_aware=False)
    questions, question_mask = left_padded(QUESTIONS[:3])
    full_ids, full_mask = torch.cat([ids, questions], 1), torch.cat([mask, question_mask], 1)
    right = full_mask.clone()
    right[1, ids.shape[1] :] = question_mask[1].flip(0)
    silent = full_mask.clone()
    silent[2, ids.shape[1] :] = 0
    other = full_mask.clone()
    other[1, 0] = 1
    cases = [
        (None, "no attention_mask"),
        (right, "row 1: the columns after the compressed prompt must be left padding"),
        (silent, "row 2 feeds no token"),
        (other, "must start with the compressed prompts' mask"),
        (full_mask[:2], "shape of input_ids"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            model.generate(full_ids, attention_mask=bad, cache=compressed.fork(), max_new_tokens=2)
    with pytest.raises(ValueError, match="3 rows; the compressed cache holds 2"):
        model.generate(full_ids, attention_mask=full_mask, cache=compressed.rows([0, 1]), max_new_tokens=2)


def test_generate_batch_wants_one_question_per_row(models) -> None:
    ids, mask = left_padded(PROMPTS[:3])
    questions, question_mask = left_padded(QUESTIONS[:2])
    with pytest.raises(ValueError, match=r"question_ids has 2 rows; input_ids has 3 \(one question per row\)"):
        pipeline_for("snapkv").generate_batch(
            models["llama"], ids, 2, attention_mask=mask, question_ids=questions, question_mask=question_mask
        )
