"""LooGLE rows -> records: one document, one turn per question, upstream's task2prompt.json filled in by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest
from eval.suites.format_rows import changed, check_bad_row, check_flags, fixture_rows, parsed

import lorekv.eval.suites.loogle  # noqa: F401  (registers the format)
from lorekv.eval.suites.record import FORMATS, Record

FMT = FORMATS["loogle"]

QA_HEAD = "Please answer the question based on the long texts below. \n"
CLOZE_HEAD = (
    "Please fill in the clozes based on the given long texts below. Each of the placeholder '<mask-n>' in the "
    "question could be an entity of Person, Location or Organiocation. The same masks represent the same entity. "
    "Output a json format answer, for example: {'<mask-0>': 'Bob', '<mask-1>': 'Gorrosion Magazine',"
    "'<mask-2>': 'Bethel Horizon'}\n"
)


def rows(task: str) -> list[dict[str, Any]]:
    return fixture_rows("loogle", task)


def records(task: str) -> list[Record]:
    return parsed(FMT, "loogle", task)


def test_shortdep_qa_has_one_turn_per_question() -> None:
    first, second = records("shortdep_qa")
    assert first.subtask == "shortdep_qa"
    assert first.context == (
        QA_HEAD + "Ada Brandt was born in Kestrel Bay in 1950. She later moved to Lowmoor, where she taught music."
    )
    assert first.separator == "\n"
    assert [t.question for t in first.turns] == [
        "Question: Where was Ada Brandt born?\nAnswer: ",
        "Question: What did Ada teach in Lowmoor?\nAnswer: ",
    ]
    assert [t.answers for t in first.turns] == [("In Kestrel Bay.",), ("Music.",)]
    check_flags(first, "loogle_rouge_l", 300)
    assert second.context == QA_HEAD + "The orchard at Fenwick had forty pear trees."
    assert len(second.turns) == 1
    assert second.turns[0].question == "Question: How many pear trees grew at Fenwick?\nAnswer: "
    assert second.turns[0].answers == ("Forty.",)


def test_longdep_qa_reads_a_list_of_pairs() -> None:
    (record,) = records("longdep_qa")
    assert record.subtask == "longdep_qa"
    assert record.context == (
        QA_HEAD + "The bridge opened in spring. Two years later a flood closed it for a month. It reopened with a "
        "wider deck."
    )
    assert record.separator == "\n"
    assert len(record.turns) == 1
    assert record.turns[0].question == "Question: What happened to the bridge after the flood?\nAnswer: "
    assert record.turns[0].answers == ("It reopened with a wider deck.",)
    check_flags(record, "loogle_rouge_l", 500)


def test_shortdep_cloze_answers_are_json_mask_maps() -> None:
    (record,) = records("shortdep_cloze")
    assert record.subtask == "shortdep_cloze"
    assert record.context == CLOZE_HEAD + "Pim Castell founded the Larkspur Choir in Veldt."
    assert record.separator == "\n "
    assert len(record.turns) == 1
    assert record.turns[0].question == (
        "Question: <mask-0> founded the Larkspur Choir in <mask-1>. What are the masked entities? \nAnswer:"
    )
    assert record.turns[0].answers == ('{"<mask-0>": "Pim Castell", "<mask-1>": "Veldt"}',)
    assert json.loads(record.turns[0].answers[0]) == {"<mask-0>": "Pim Castell", "<mask-1>": "Veldt"}
    check_flags(record, "loogle_cloze_exact", 50)


def test_longdep_summarization_has_one_turn_with_the_summary() -> None:
    (record,) = records("longdep_summarization")
    assert record.subtask == "longdep_summarization"
    assert record.context == (
        "Please generate a summary of the below paper. \nSparse caches for tiny models\n\nWe keep the few keys that "
        "matter and drop the rest."
    )
    assert record.separator == "\n "
    assert len(record.turns) == 1
    assert record.turns[0].question == "Summarization: "
    assert record.turns[0].answers == ("The paper keeps only the important keys of a cache.",)
    check_flags(record, "loogle_rouge_l", 500)


def test_the_prompt_of_each_question_is_the_upstream_prompt() -> None:
    (record,) = records("shortdep_cloze")
    prompt = record.context + record.separator + record.turns[0].question
    assert prompt == (
        CLOZE_HEAD + "Pim Castell founded the Larkspur Choir in Veldt.\n Question: <mask-0> founded the Larkspur Choir "
        "in <mask-1>. What are the masked entities? \nAnswer:"
    )


def test_subtask_hint_and_explicit_subtask() -> None:
    assert FMT.subtask_hint("LooGLE-testdata/shortdep_qa.jsonl") == "shortdep_qa"
    assert FMT.subtask_hint("longdep_summarization.jsonl") == "longdep_summarization"
    record = FMT.parse(rows("shortdep_qa")[0], "longdep_qa")
    assert record.subtask == "longdep_qa"
    assert record.max_new_tokens == 500


def bad(task: str, **change: Any) -> dict[str, Any]:
    return changed(rows(task)[0], **change)


@pytest.mark.parametrize(
    ("task", "row", "message"),
    [
        ("shortdep_qa", bad("shortdep_qa", input=None), "missing field 'input'"),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs=None), "missing field 'qa_pairs'"),
        (
            "shortdep_qa",
            bad("shortdep_qa", qa_pairs="[{'Q': 'How many?', 'A': 'Forty.'"),
            "field 'qa_pairs' is not a Python literal",
        ),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs="__import__('os')"), "field 'qa_pairs' is not a Python literal"),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs="[]"), "field 'qa_pairs' is empty"),
        ("longdep_qa", bad("longdep_qa", qa_pairs=[]), "field 'qa_pairs' is empty"),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs="none"), "field 'qa_pairs' is 'none'"),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs="[{'Q': 'Why?'}]"), "field 'qa_pairs' item 0 has no 'A'"),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs="[{'Q': 'Why?', 'A': ''}]"), "field 'qa_pairs' item 0"),
        ("shortdep_qa", bad("shortdep_qa", qa_pairs="{'Q': 'Why?'}"), "field 'qa_pairs' must be a list"),
        ("shortdep_cloze", bad("shortdep_qa"), "field 'qa_pairs' item 0: a cloze 'A'"),
        ("longdep_summarization", bad("longdep_summarization", output=None), "missing field 'output'"),
        ("longdep_summarization", bad("longdep_summarization", output=""), "field 'output' is empty"),
        ("shortdep_qa_v2", rows("shortdep_qa")[0], "unknown LooGLE task 'shortdep_qa_v2'"),
        ("longdep_summarization", bad("longdep_summarization", output=["a"]), "field 'output' must be str"),
        (None, rows("shortdep_qa")[0], "no LooGLE task"),
    ],
)
def test_bad_rows_raise_row_error(task: str | None, row: dict[str, Any], message: str) -> None:
    check_bad_row(FMT, task, row, message)


def test_format_is_registered_with_its_attributes() -> None:
    assert FMT.name == "loogle"
    assert FMT.suite == "LooGLE"
    assert FMT.fields == ("input",)
    assert FMT.subtasks == ("shortdep_qa", "longdep_qa", "longdep_summarization", "shortdep_cloze")
