"""Samples with the real SmolLM2 tokenizer and chat template: lengths, answers, gold tokens, speed."""

from __future__ import annotations

import time

import pytest

from lorekv.eval.tasks import TASKS, make_sample, parse_task
from lorekv.models.tokens import SPLIT

pytestmark = pytest.mark.integration

LONG = [n for n in TASKS.names() if n != "list_recall"] + [{"name": "list_recall", "item": "phrase"}]
"""Every family at its defaults but list recall's 200 nouns (about 1K tokens), its phrases instead."""
SPECS = [
    *LONG,
    {"name": "niah_single", "haystack": "noise", "value": "uuid"},
    {"name": "niah_multikey", "haystack": "needles", "key": "uuid"},
    {"name": "niah_multiquery", "value": "word"},
    {"name": "variable_tracking", "num_chains": 2},
]
IDS = [parse_task(spec).label for spec in SPECS]


@pytest.mark.parametrize("length", [512, 1500])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_prompt_fits_the_length_and_answers_are_marked(spec, length, smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    sample = make_sample(spec, tok, length, index=0, seed=1)
    ids = sample.prompt_ids(tok)[0]
    assert 0.9 * length <= ids.shape[0] <= length
    text = sample.prompt_text(tok)
    assert text.startswith("<|im_start|>") and text.endswith(sample.answer_prefix)
    assert sample.context in text.split(SPLIT)[0]
    positions = sample.answer_positions(tok)
    context_len = sample.context_and_question_ids(tok)[0].shape[1]
    assert positions and positions[-1] < context_len
    # Group the marked positions into runs; every answer is decoded from some run, and every run holds one.
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    decoded = [tok.decode(ids[run]).lower() for run in runs]
    for answer in sample.answers:
        assert answer.lower() in sample.context.lower()
        assert any(answer.lower() in d for d in decoded)
    for d in decoded:
        assert any(a.lower() in d for a in sample.answers)


def test_a_sample_is_reproducible_with_the_real_tokenizer(smollm2_tokenizer) -> None:
    first = make_sample("niah_multivalue", smollm2_tokenizer, 1500, index=4, seed=2)
    assert make_sample("niah_multivalue", smollm2_tokenizer, 1500, index=4, seed=2) == first
    assert make_sample("niah_multivalue", smollm2_tokenizer, 1500, index=5, seed=2) != first


@pytest.mark.parametrize("name", LONG, ids=[parse_task(spec).label for spec in LONG])
def test_a_1500_token_prompt_is_built_well_under_a_second(name, smollm2_tokenizer) -> None:
    make_sample(name, smollm2_tokenizer, 1500, index=99)  # warm the caches (word lists, facts)
    start = time.perf_counter()
    make_sample(name, smollm2_tokenizer, 1500, index=100)
    assert time.perf_counter() - start < 0.5
