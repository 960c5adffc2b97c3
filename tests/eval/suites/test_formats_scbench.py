"""SCBench rows -> records: one shared context, one turn per entry of ``multi_turns``, upstream's templates by hand."""

from __future__ import annotations

from typing import Any

import pytest
from eval.suites.format_rows import changed, check_bad_row, check_flags, fixture_rows, parsed

import lorekv.eval.suites.scbench  # noqa: F401  (registers the format)
from lorekv.eval.suites.record import FORMATS, Record

FMT = FORMATS["scbench"]


def rows(task: str) -> list[dict[str, Any]]:
    return fixture_rows("scbench", task)


def records(task: str) -> list[Record]:
    return parsed(FMT, "scbench", task)


def test_kv_has_one_turn_per_question() -> None:
    first, second = records("scbench_kv")
    assert first.subtask == "scbench_kv"
    assert first.context == (
        'Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n{"k-1": '
        '"v-one", "k-2": "v-two", "k-3": "v-three"}'
    )
    assert first.separator == "\n\n"
    assert [t.question for t in first.turns] == [
        'Key: "k-2"\nThe value associated with the specified key is: ',
        'Key: "k-3"\nThe value associated with the specified key is: ',
    ]
    assert [t.answers for t in first.turns] == [("v-two",), ("v-three",)]
    assert [t.answer_prefix for t in first.turns] == ["", ""]
    check_flags(first, "scbench_kv_retrieval", 150)
    assert len(second.turns) == 1
    assert second.turns[0].answers == ("v-nine",)


def test_choice_turns_carry_their_options_and_letters() -> None:
    (record,) = records("scbench_choice_eng")
    assert record.context == (
        "Read the book and answer the question.\n\nWren fed the goats, then mended the fence, then baked bread."
    )
    assert record.separator == "\n\n"
    assert [t.question for t in record.turns] == [
        "Question: What did Wren do first?\nA. Baked bread\nB. Fed the goats\nC. Mended the fence\nD. Slept\n\n"
        "The the correct answer is",
        "Question: What did Wren do last?\nA. Baked bread\nB. Fed the goats\nC. Mended the fence\nD. Slept\n\n"
        "The the correct answer is",
    ]
    assert [t.answers for t in record.turns] == [("Fed the goats", "B"), ("Baked bread", "A")]
    check_flags(record, "infbench_longbook_choice_eng", 40)


def test_mf_puts_the_first_target_before_the_context_and_later_ones_before_their_question() -> None:
    (record,) = records("scbench_mf")
    assert record.context == "What is the largest number in the list?\n\n[8, 3, 14, 6]"
    assert record.separator == "\n\n"
    assert [t.question for t in record.turns] == [
        "You should answer with only one number, no other words. The largest number in the list is: ",
        "What is the smallest number in the list?\n\nYou should answer with only one number, no other words. "
        "The smallest number in the list is: ",
    ]
    assert [t.answers for t in record.turns] == [("14",), ("3",)]
    check_flags(record, "infbench_math_find", 5)


def test_summary_later_turns_start_with_this_paper() -> None:
    (record,) = records("scbench_summary")
    assert record.context == "Tiny caches\n\nWe drop keys that no query needs."
    assert record.separator == "\n\n"
    assert [t.question for t in record.turns] == ["Please summarize the paper.", "Now summarize it in one line."]
    assert [t.answer_prefix for t in record.turns] == ["", "This paper"]
    assert [t.answers for t in record.turns] == [("The paper drops unneeded keys.",), ("Unneeded keys are dropped.",)]
    check_flags(record, "infbench_longbook_sum_eng", 200)


def test_qa_eng_reads_the_context_from_input_when_there_is_no_context() -> None:
    (record,) = records("scbench_qa_eng")
    assert record.context == (
        "Read the book and answer the question. Be very concise in your answer.\n\n"
        "Juno rowed across the lake to fetch her brother Cal."
    )
    assert record.separator == "\n\n"
    assert [t.question for t in record.turns] == ["Question: Who did Juno fetch?\nAnswer:"]
    assert record.turns[0].answers == ("Cal", "her brother")
    check_flags(record, "part", 40)


def test_vt_needs_all_answers() -> None:
    (record,) = records("scbench_vt")
    assert record.context == "VAR AAA = 5\nVAR BBB = VAR AAA\nVAR CCC = VAR BBB"
    assert record.separator == "\n\n"
    assert record.turns[0].question == "Find all variables that are assigned the value 5."
    assert record.turns[0].answers == ("AAA", "BBB", "CCC")
    check_flags(record, "all", 30)


def test_subtask_hint_and_explicit_subtask() -> None:
    assert FMT.subtask_hint("data/scbench_kv.jsonl") == "scbench_kv"
    assert FMT.subtask_hint("scbench_kv_hard.jsonl") == "scbench_kv_hard"
    record = FMT.parse(rows("scbench_kv")[0], "scbench_kv_hard")
    assert record.subtask == "scbench_kv_hard"
    assert len(record.turns) == 2


def bad(task: str, **change: Any) -> dict[str, Any]:
    return changed(rows(task)[0], **change)


def turn0(task: str, **change: Any) -> dict[str, Any]:
    row = rows(task)[0]
    return {**row, "multi_turns": [changed(row["multi_turns"][0], **change), *row["multi_turns"][1:]]}


@pytest.mark.parametrize(
    ("task", "row", "message"),
    [
        ("scbench_kv", bad("scbench_kv", context=None), "missing field 'context'"),
        ("scbench_kv", bad("scbench_kv", multi_turns=None), "missing field 'multi_turns'"),
        ("scbench_kv", bad("scbench_kv", multi_turns=[]), "field 'multi_turns' is empty"),
        ("scbench_kv", bad("scbench_kv", multi_turns="Key: k-1"), "field 'multi_turns' must be list"),
        ("scbench_kv", turn0("scbench_kv", input=None), "field 'multi_turns' item 0 has no 'input'"),
        ("scbench_kv", turn0("scbench_kv", answer=None), "field 'multi_turns' item 0 has no 'answer'"),
        ("scbench_vt", turn0("scbench_vt", answer=[]), r"field 'multi_turns\[0\].answer' is empty"),
        ("scbench_choice_eng", turn0("scbench_choice_eng", options=None), "'options' must be a list of 4"),
        ("scbench_choice_eng", turn0("scbench_choice_eng", answer="Swam"), "'answer' must be one of its 'options'"),
        ("scbench_mf", turn0("scbench_mf", input="Which number?"), "'input' has no 'The ... is' phrase"),
        ("scbench_repoqa", rows("scbench_kv")[0], "'scbench_repoqa' is not supported"),
        ("scbench_summary_with_needles", rows("scbench_kv")[0], "is not supported"),
        ("scbench_kv_v3", rows("scbench_kv")[0], "unknown SCBench task 'scbench_kv_v3'"),
        (None, rows("scbench_kv")[0], "no SCBench task"),
    ],
)
def test_bad_rows_raise_row_error(task: str | None, row: dict[str, Any], message: str) -> None:
    check_bad_row(FMT, task, row, message)


def test_format_is_registered_with_its_attributes() -> None:
    assert FMT.name == "scbench"
    assert FMT.suite == "SCBench"
    assert FMT.fields == ("multi_turns",)
    assert "scbench_kv" in FMT.subtasks
    assert "scbench_repoqa" not in FMT.subtasks
