"""Samples of every family, with a tiny regex tokenizer: lengths, gold answers, determinism."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lorekv.eval.tasks import TASKS, Sample, make_sample, parse_task
from lorekv.models.tokens import SPLIT

SPECS = [
    "niah_single",
    {"name": "niah_single", "haystack": "noise"},
    {"name": "niah_single", "haystack": "noise", "value": "uuid"},
    {"name": "niah_single", "key": "number", "value": "word"},
    "niah_multikey",
    {"name": "niah_multikey", "haystack": "needles"},
    {"name": "niah_multikey", "haystack": "needles", "key": "uuid", "value": "uuid"},
    {"name": "niah_multikey", "haystack": "noise", "num_distractors": 6},
    "niah_multivalue",
    {"name": "niah_multivalue", "value": "word", "haystack": "noise"},
    "niah_multiquery",
    {"name": "niah_multiquery", "key": "uuid", "num_queries": 3},
    "variable_tracking",
    {"name": "variable_tracking", "num_chains": 2, "num_hops": 2},
    "common_words",
    {"name": "common_words", "num_common": 5, "freq_common": 4, "freq_uncommon": 2},
    "frequent_words",
    {"name": "frequent_words", "alpha": 1.5, "num_answers": 4},
    "qa",
    {"name": "qa", "num_facts": 3},
]
IDS = [parse_task(spec).label for spec in SPECS]
NEEDLE = re.compile(r"The special magic (number|word|uuid) for (\S+) is: (\S+?)\.(?=\s|$)")
MAX_NEW_TOKENS = {
    "niah_single": 16,
    "niah_multikey": 16,
    "niah_multivalue": 40,
    "niah_multiquery": 40,
    "variable_tracking": 33,
    "common_words": 64,
    "frequent_words": 32,
    "qa": 32,
}


def body(sample: Sample) -> str:
    """The context without its first paragraph (the instructions)."""
    return sample.context.split("\n\n", 1)[1]


@pytest.mark.parametrize("length", [512, 1500])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_prompt_fits_the_length_and_holds_the_answers(spec, length, tiny_tokenizer) -> None:
    sample = make_sample(spec, tiny_tokenizer, length, index=1, seed=7)
    n = sample.prompt_ids(tiny_tokenizer).shape[1]
    assert 0.9 * length <= n <= length
    assert sample.task == parse_task(spec).label and sample.index == 1 and sample.seed == 7
    assert sample.answers and len(set(sample.answers)) == len(sample.answers)
    for answer in sample.answers:
        assert answer.lower() in sample.context.lower()
    assert sample.score(" ".join(sample.answers)) == 1.0
    assert sample.score("I do not know.") == 0.0
    assert sample.metric == "all"
    if isinstance(spec, str):
        assert sample.max_new_tokens == MAX_NEW_TOKENS[spec]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_prompt_text_and_split(spec, tiny_tokenizer) -> None:
    sample = make_sample(spec, tiny_tokenizer, 600, seed=3)
    text = sample.prompt_text(tiny_tokenizer)
    assert text.count(SPLIT) == 1
    before, after = text.split(SPLIT)
    assert before.endswith(sample.context) and sample.question in after
    assert text.endswith(sample.answer_prefix)
    context_ids, question_ids = sample.context_and_question_ids(tiny_tokenizer)
    assert torch.equal(torch.cat([context_ids, question_ids], dim=1), sample.prompt_ids(tiny_tokenizer))


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_answer_positions_cover_every_occurrence_in_the_context(spec, tiny_tokenizer) -> None:
    sample = make_sample(spec, tiny_tokenizer, 700, seed=5)
    text = sample.prompt_text(tiny_tokenizer).replace(SPLIT, "")
    encoded = tiny_tokenizer(text, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    positions = sample.answer_positions(tiny_tokenizer)
    context_ids, _ = sample.context_and_question_ids(tiny_tokenizer)
    assert positions == sorted(set(positions)) and positions[-1] < context_ids.shape[1]
    marked = set(positions)
    start = text.index(sample.context)
    for answer in sample.answers:
        occurrences = [m.start() for m in re.finditer(re.escape(answer), sample.context, re.IGNORECASE)]
        assert occurrences
        for at in occurrences:
            a, b = start + at, start + at + len(answer)
            covering = [i for i, (x, y) in enumerate(offsets) if x < b and a < y]
            assert set(covering) <= marked
            assert answer.lower() in "".join(text[offsets[i][0] : offsets[i][1]] for i in covering).lower()
    # Every marked token overlaps some answer's occurrence.
    for i in positions:
        x, y = offsets[i]
        assert any(a.lower() in text[max(0, x - 40) : y + 40].lower() for a in sample.answers)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_a_seed_reproduces_a_sample_and_indices_differ(spec, tiny_tokenizer) -> None:
    first = make_sample(spec, tiny_tokenizer, 512, index=2, seed=11)
    assert make_sample(spec, tiny_tokenizer, 512, index=2, seed=11) == first
    assert make_sample(parse_task(spec), tiny_tokenizer, 512, index=2, seed=11) == first
    other_index = make_sample(spec, tiny_tokenizer, 512, index=3, seed=11)
    other_seed = make_sample(spec, tiny_tokenizer, 512, index=2, seed=12)
    assert other_index.context != first.context and other_index.index == 3
    assert other_seed.context != first.context


def needles(sample: Sample) -> list[tuple[str, str, str]]:
    return NEEDLE.findall(sample.context)


def test_niah_single_has_one_needle_asked_about(tiny_tokenizer) -> None:
    for index in range(5):
        sample = make_sample({"name": "niah_single", "value": "uuid"}, tiny_tokenizer, 800, index=index)
        ((kind, key, value),) = needles(sample)
        assert kind == "uuid" and sample.answers == (value,)
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", value)
        assert key in sample.question and key in sample.answer_prefix and re.fullmatch(r"[a-z]+-[a-z]+", key)


def test_niah_values_are_seven_digit_numbers(tiny_tokenizer) -> None:
    sample = make_sample("niah_multivalue", tiny_tokenizer, 800)
    assert all(re.fullmatch(r"[1-9]\d{6}", v) for v in sample.answers)


@pytest.mark.parametrize("haystack", ["prose", "noise"])
def test_niah_multikey_distractors_have_other_keys_and_values(haystack, tiny_tokenizer) -> None:
    config = {"name": "niah_multikey", "haystack": haystack, "num_distractors": 5}
    sample = make_sample(config, tiny_tokenizer, 1000, seed=2)
    found = needles(sample)
    assert len(found) == 6
    keys, values = [k for _, k, _ in found], [v for _, _, v in found]
    assert len(set(keys)) == 6 and len(set(values)) == 6 and not set(keys) & set(values)
    (target,) = [(k, v) for _, k, v in found if k in sample.question]
    assert sample.answers == (target[1],)
    for key in keys:
        if key != target[0]:
            assert key not in sample.question


def test_niah_multikey_needle_haystack_is_all_needles(tiny_tokenizer) -> None:
    sample = make_sample({"name": "niah_multikey", "haystack": "needles"}, tiny_tokenizer, 1500)
    found = needles(sample)
    assert len(found) > 20
    assert NEEDLE.sub("", body(sample)).strip() == ""
    keys = [k for _, k, _ in found]
    assert len(set(keys)) == len(keys)
    assert [v for _, k, v in found if k in sample.question] == list(sample.answers)


def test_niah_multivalue_has_every_value_under_the_one_key(tiny_tokenizer) -> None:
    sample = make_sample({"name": "niah_multivalue", "num_values": 5}, tiny_tokenizer, 1000)
    found = needles(sample)
    assert len(found) == 5 and len({k for _, k, _ in found}) == 1
    assert sorted(v for _, _, v in found) == sorted(sample.answers)
    assert found[0][1] in sample.question


def test_niah_multiquery_asks_about_every_key(tiny_tokenizer) -> None:
    sample = make_sample("niah_multiquery", tiny_tokenizer, 1000)
    found = needles(sample)
    assert len(found) == 4 and len({k for _, k, _ in found}) == 4
    for _, key, value in found:
        assert key in sample.question and value in sample.answers
    assert "are" in sample.answer_prefix


def test_needle_depths_spread_over_the_haystack(tiny_tokenizer) -> None:
    depths = []
    for index in range(24):
        sample = make_sample({"name": "niah_single", "haystack": "noise"}, tiny_tokenizer, 600, index=index)
        text = body(sample)
        depths.append(text.index("The special magic") / len(text))
    assert min(depths) < 0.2 and max(depths) > 0.8
    assert 0.25 < sum(depths) / len(depths) < 0.75


@pytest.mark.parametrize(("chains", "hops"), [(1, 4), (3, 2), (2, 6)])
def test_variable_tracking_chain_is_complete_and_in_order(chains, hops, tiny_tokenizer) -> None:
    config = {"name": "variable_tracking", "num_chains": chains, "num_hops": hops}
    sample = make_sample(config, tiny_tokenizer, 1200, seed=chains)
    statements = re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})\.", sample.context)
    assert len(statements) == chains * (hops + 1)
    defined: dict[str, str] = {}
    for name, source in statements:  # every variable is assigned once, after its source
        assert name not in defined
        if source.startswith("VAR "):
            assert source[4:] in defined
        defined[name] = source
    value = re.search(r"value (\d{5})", sample.question).group(1)
    holders = {n for n, s in statements if s == value}
    grown = True
    while grown:
        more = {n for n, s in statements if s.startswith("VAR ") and s[4:] in holders}
        grown = not more <= holders
        holders |= more
    assert holders == set(sample.answers) and len(holders) == hops + 1
    assert f"{hops + 1} variables" in sample.answer_prefix
    assert len({s for s in defined.values() if not s.startswith("VAR ")}) == chains  # distinct values


@pytest.mark.parametrize(("length", "freqs"), [(1500, (6, 1)), (4096, (30, 3))])
def test_common_words_are_the_most_frequent_in_the_list(length, freqs, tiny_tokenizer) -> None:
    sample = make_sample("common_words", tiny_tokenizer, length, seed=4)
    entries = re.findall(r"(\d+)\. ([a-z]+)", body(sample))
    assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
    counts = Counter(w for _, w in entries)
    assert len(sample.answers) == 10
    assert {counts[w] for w in sample.answers} == {freqs[0]}
    assert {c for w, c in counts.items() if w not in sample.answers} == {freqs[1]}
    assert len(counts) > 20
    for common in sample.answers:  # no other word contains a common word or is part of one
        assert not any(common in w or w in common for w in counts if w != common)


@pytest.mark.parametrize("spec", ["frequent_words", {"name": "frequent_words", "alpha": 1.5, "num_answers": 5}])
@pytest.mark.parametrize("length", [512, 3000])
def test_frequent_words_are_strictly_the_most_frequent(spec, length, tiny_tokenizer) -> None:
    sample = make_sample(spec, tiny_tokenizer, length, seed=9)
    counts = Counter(body(sample).split())
    assert all(re.fullmatch(r"[a-z]{5}", w) for w in counts)
    ranked = [w for w, _ in counts.most_common()]
    k = len(sample.answers)
    assert set(ranked[:k]) == set(sample.answers)
    assert min(counts[w] for w in sample.answers) > max(c for w, c in counts.items() if w not in sample.answers)


def test_qa_blanks_fill_back_into_sentences_of_the_context(tiny_tokenizer) -> None:
    for index in range(6):
        sample = make_sample({"name": "qa", "num_facts": 3}, tiny_tokenizer, 1200, index=index)
        quoted = re.findall(r"^\d\. (.*)$", sample.question, flags=re.MULTILINE)
        assert len(quoted) == 3 and len(sample.answers) == 3
        for line, answer in zip(quoted, sample.answers, strict=True):
            assert line.count("____") == 1
            assert line.replace("____", answer) in sample.context
            assert len(answer) >= 5 and answer.isalpha()
            assert not re.search(rf"\b{answer}\b", line)


def test_every_family_has_a_default_sample(tiny_tokenizer) -> None:
    for name in TASKS.names():
        sample = make_sample(name, tiny_tokenizer, 512)
        expected = 8 + 6 * len(sample.answers) if name == "list_recall" else MAX_NEW_TOKENS[name]
        assert sample.task == name and sample.max_new_tokens == expected


@pytest.mark.parametrize("item,length", [("noun", 256), ("noun", 280), ("phrase", 256), ("phrase", 1500)])
def test_list_recall_lists_distinct_items_in_order_and_asks_for_all_of_them(item, length, tiny_tokenizer) -> None:
    sample = make_sample({"name": "list_recall", "item": item}, tiny_tokenizer, length, index=2, seed=5)
    assert 0.9 * length <= sample.prompt_ids(tiny_tokenizer).shape[1] <= length
    items = list(sample.answers)
    lines = sample.context.split("\n\n", 1)[1].split("\n")
    assert lines == [f"{k}. {it}" for k, it in enumerate(items, 1)]
    assert len(set(items)) == len(items) >= 4 and all(len(it.split()) == (1 if item == "noun" else 2) for it in items)
    assert f"all {len(items)} items" in sample.question and sample.answer_prefix == "1."
    assert sample.metric == "in_order" and sample.max_new_tokens == 8 + (6 if item == "noun" else 8) * len(items)
    assert sample.score("\n".join(lines)) == 1.0 and sample.score(" ".join(reversed(items))) == 1 / len(items)
    longer = make_sample({"name": "list_recall", "item": item}, tiny_tokenizer, 2 * length, index=2, seed=5)
    assert len(longer.answers) > len(items) and longer.max_new_tokens > sample.max_new_tokens


@settings(max_examples=20)
@given(
    spec=st.sampled_from(SPECS),
    length=st.integers(min_value=480, max_value=2500),
    index=st.integers(min_value=0, max_value=1000),
    seed=st.integers(min_value=-(2**40), max_value=2**40),
)
def test_any_length_is_hit(spec, length, index, seed, tiny_tokenizer) -> None:
    sample = make_sample(spec, tiny_tokenizer, length, index=index, seed=seed)
    assert 0.9 * length <= sample.prompt_ids(tiny_tokenizer).shape[1] <= length
    assert all(a.lower() in sample.context.lower() for a in sample.answers)
