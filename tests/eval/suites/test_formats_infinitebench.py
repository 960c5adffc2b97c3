"""InfiniteBench rows -> records: the prompts of upstream's ``yarn_mistral_templates`` filled in by hand."""

from __future__ import annotations

from typing import Any

import pytest
from eval.suites.format_rows import changed, check_bad_row, fixture_rows, parsed

import lorekv.eval.suites.infinitebench  # noqa: F401  (registers the format)
from lorekv.eval.suites.record import FORMATS, Record

FMT = FORMATS["infinitebench"]


def rows(task: str) -> list[dict[str, Any]]:
    return fixture_rows("infinitebench", task)


def records(task: str) -> list[Record]:
    return parsed(FMT, "infinitebench", task)


# (task, row, context, separator, question, answers, metric, max_new_tokens)
CASES = [
    (
        "passkey",
        0,
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
        "about the important information.\n\nThe kettle hums. The lamp glows. The pass key is 48213. Remember it. "
        "48213 is the pass key. The kettle hums.",
        "\n\n",
        "What is the pass key?\n\nThe pass key is",
        ("48213",),
        "infbench_passkey",
        6,
    ),
    (
        "passkey",
        1,
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
        "about the important information.\n\nRain taps the roof. The pass key is 907. Remember it. 907 is the pass "
        "key. Rain taps the roof.",
        "\n\n",
        "What is the pass key?\n\nThe pass key is",
        ("907",),
        "infbench_passkey",
        6,
    ),
    (
        "number_string",
        0,
        "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the "
        "important information there.\n\nClouds drift by. The sequence of digits is 5550123. Remember it. "
        "Clouds drift by.",
        "\n\n",
        "What is the sequence number?\n\nThe sequence of digits is",
        ("5550123",),
        "infbench_passkey",
        12,
    ),
    (
        "kv_retrieval",
        0,
        'Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n{"k-aa1": '
        '"v-101", "k-bb2": "v-202", "k-cc3": "v-303"}',
        "\n\n",
        'Key: "k-bb2"\nThe value associated with the specified key is: ',
        ("v-202",),
        "infbench_kv_retrieval",
        50,
    ),
    (
        "longbook_qa_eng",
        0,
        "Read the book and answer the question. Be very concise in your answer.\n\nMira kept bees behind the mill. "
        "Every spring she sold honey to the baker, Tobin.",
        "\n\n",
        "Question: Who bought honey from Mira?\nAnswer:",
        ("Tobin", "the baker Tobin"),
        "infbench_longbook_qa_eng",
        40,
    ),
    (
        "longbook_qa_eng",
        1,
        "Read the book and answer the question. Be very concise in your answer.\n\nThe ferry left at dawn and came "
        "back at dusk.",
        "\n\n",
        "Question: When did the ferry leave?\nAnswer:",
        ("At dawn",),
        "infbench_longbook_qa_eng",
        40,
    ),
    (
        "longbook_qa_chn",
        0,
        "阅读以下书籍然后回答问题。\n\n小林每天早上去河边钓鱼。",
        "\n\n",
        "问题：小林早上去哪里？\n答案：",
        ("河边",),
        "infbench_longbook_qa_chn",
        40,
    ),
    (
        "longbook_sum_eng",
        0,
        "Summarize the book below.\n\nChapter one. A clockmaker loses his keys. Chapter two. His cat finds them.",
        "\n\n",
        "Summary:",
        ("A clockmaker loses his keys and his cat finds them.",),
        "infbench_longbook_sum_eng",
        1200,
    ),
    (
        "longbook_choice_eng",
        0,
        "Read the book and answer the question.\n\nOren painted the gate blue, then green, then left it grey.",
        "\n\n",
        "Question: What colour was the gate in the end?\nA. Blue\nB. Green\nC. Grey\nD. Red\n\n"
        "The letter of the correct answer is",
        ("Grey", "C"),
        "infbench_longbook_choice_eng",
        40,
    ),
    (
        "longbook_choice_eng",
        1,
        "Read the book and answer the question.\n\nOren sang by the well.",
        "\n\n",
        "Question: What did Oren do?\nA. Slept\nB. Sang\nC. Swam\nD. Sat\n\nThe letter of the correct answer is",
        ("Sang", "B"),
        "infbench_longbook_choice_eng",
        40,
    ),
    (
        "longdialogue_qa_eng",
        0,
        'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and '
        "you should try to guess who that character is.\n\nNELL: Pass the salt.\n$$MASK$$: Here you go.\n"
        "NELL: Thanks, Abe.",
        "\n\n",
        "The name that has been replaced with $$MASK$$ is likely",
        ("ABE",),
        "infbench_longdialogue_qa_eng",
        40,
    ),
    (
        "math_find",
        0,
        "What is the largest number in the following list?\n\n[4, 17, 9, 2, 11]",
        "\n\n",
        "What is the largest number in the list? You should answer with only one number, no other words. "
        "The largest number of the list is: ",
        ("17",),
        "infbench_math_find",
        3,
    ),
    (
        "math_calc",
        0,
        "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\nValues: [1, 4, 8]\n\n"
        "Expression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: 3 + 2 - 4",
        "\n",
        "Values:",
        ("[3, 5, 1]",),
        "infbench_math_calc",
        30000,
    ),
    (
        "code_run",
        0,
        "There is a function called func_2 in the following Python code.\n\ndef func_1(x):\n    return x + 2\n\n"
        "def func_2(x):\n    return func_1(x) * 3",
        "\n\n",
        "Please compute the exact value of func_2(-5). The value of func_2(-5) is",
        ("-9",),
        "infbench_code_run",
        5,
    ),
    (
        "code_debug",
        0,
        "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it "
        "crash.\n\ndef add(a, b):\n    return a + b\n\ndef half(a):\n    return a / 0",
        "\n\n",
        "Options:\nA. add\nB. half\nC. main\nD. load\n\nThe correct option is:",
        ("half", "B"),
        "infbench_code_debug",
        5,
    ),
]


@pytest.mark.parametrize(
    ("task", "index", "context", "separator", "question", "answers", "metric", "max_new_tokens"),
    CASES,
    ids=[f"{c[0]}-{c[1]}" for c in CASES],
)
def test_record_is_the_upstream_prompt(
    task: str,
    index: int,
    context: str,
    separator: str,
    question: str,
    answers: tuple[str, ...],
    metric: str,
    max_new_tokens: int,
) -> None:
    record = records(task)[index]
    assert record.subtask == task
    assert record.context == context
    assert record.separator == separator
    assert len(record.turns) == 1
    turn = record.turns[0]
    assert turn.question == question
    assert turn.answer_prefix == ""
    assert turn.answers == answers
    assert record.metric == metric
    assert record.max_new_tokens == max_new_tokens
    assert record.chat is True
    assert record.truncate is True


def test_every_task_has_a_fixture_case() -> None:
    assert {c[0] for c in CASES} == set(FMT.subtasks)
    assert len(FMT.subtasks) == 12


def test_subtask_hint_is_the_file_stem() -> None:
    assert FMT.subtask_hint("/data/InfiniteBench/longbook_qa_eng.jsonl") == "longbook_qa_eng"
    assert FMT.subtask_hint("kv_retrieval.jsonl") == "kv_retrieval"
    assert FMT.subtask_hint("shorter/longdialogue_qa_eng_1000.jsonl") == "longdialogue_qa_eng"
    assert FMT.subtask_hint("notes.jsonl") == "notes"


def test_an_explicit_subtask_is_used_whatever_the_file() -> None:
    row = rows("longbook_qa_eng")[0]
    record = FMT.parse(row, "longbook_qa_chn")
    assert record.subtask == "longbook_qa_chn"
    assert record.context.startswith("阅读以下书籍然后回答问题。\n\n")
    assert record.metric == "infbench_longbook_qa_chn"


def bad(task: str, **change: Any) -> dict[str, Any]:
    return changed(rows(task)[0], **change)


@pytest.mark.parametrize(
    ("task", "row", "message"),
    [
        ("passkey", bad("passkey", context=None), "missing field 'context'"),
        ("passkey", bad("passkey", input=None), "missing field 'input'"),
        ("passkey", bad("passkey", answer=None), "missing field 'answer'"),
        ("longbook_qa_eng", bad("longbook_qa_eng", answer=[]), "field 'answer' is empty"),
        ("longbook_qa_eng", bad("longbook_qa_eng", context=["not", "text"]), "field 'context' must be str"),
        ("longbook_choice_eng", bad("longbook_choice_eng", options=None), "missing field 'options'"),
        ("longbook_choice_eng", bad("longbook_choice_eng", options=["A", "B"]), "field 'options'"),
        ("longbook_choice_eng", bad("longbook_choice_eng", answer=["Purple"]), "field 'answer'"),
        ("code_debug", bad("code_debug", answer=[]), "field 'answer' is empty"),
        ("math_find", bad("math_find", input="Which number is largest?"), "field 'input'"),
        ("code_run", bad("code_run", input="What does it return?"), "field 'input'"),
        ("math_calc", bad("math_calc", answer=[]), "field 'answer' is empty"),
        ("passkey_plus", rows("passkey")[0], "unknown InfiniteBench task 'passkey_plus'"),
        (None, rows("passkey")[0], "no InfiniteBench task"),
    ],
)
def test_bad_rows_raise_row_error(task: str | None, row: dict[str, Any], message: str) -> None:
    check_bad_row(FMT, task, row, message)


def test_format_is_registered_with_its_attributes() -> None:
    assert FMT.name == "infinitebench"
    assert FMT.suite == "InfiniteBench"
    assert FMT.fields == ("context", "input", "answer")
    assert "longbook_qa_eng" in FMT.subtasks
