"""InfiniteBench: its twelve tasks read from the suite's own JSONL files.

InfiniteBench (Zhang et al., "∞Bench: Extending Long Context Evaluation Beyond 100K Tokens",
https://arxiv.org/abs/2402.13718, https://github.com/OpenBMB/InfiniteBench) ships one file per task
(``passkey.jsonl``, ``longbook_qa_eng.jsonl``, ...); a row holds ``id``, ``context``, ``input``,
``answer`` (a string or a list) and ``options`` (four choices for ``longbook_choice_eng`` and
``code_debug``). The rows do not name their task: the file name does (:meth:`InfiniteBench.subtask_hint`).

Where each part comes from, in the upstream repository:

- prompt templates: ``src/prompt.py``, ``yarn_mistral_templates``, the set ``src/eval_utils.py``
  (``MODEL_TO_PROMPT_TEMPLATE``) gives every open-source model (Yarn-Mistral, Yi-6B/34B-200K, ChatGLM3);
  the ``{prefix}`` of ``math_find`` and the ``{func}``/``{func_call}`` of ``code_run`` are derived from
  ``input`` as ``create_prompt`` in ``src/eval_utils.py`` does;
- answer lengths: ``DATA_NAME_TO_MAX_NEW_TOKENS`` in ``src/eval_utils.py``;
- gold answers: ``get_answer`` in ``src/eval_utils.py`` (the two choice tasks score against the option
  text and its letter);
- metrics: ``get_score_one`` in ``src/compute_scores.py``, one ``infbench_*`` metric per distinct scorer
  (:data:`METRICS`);
- truncation: the scripts (``src/eval_yarn_mistral.py``, ``src/eval_chatglm.py``) cut a prompt longer than
  the model's 128K tokens in the middle, keeping the head and the tail: ``truncate=True``.

The context comes first: each template is split at ``{context}``; what precedes it, with the row's
context, is :attr:`Record.context`; the whitespace right after it is :attr:`Record.separator`; the rest,
filled in, is the one :class:`Turn`'s question. ``context + separator + question`` is the upstream prompt
character for character.

Chat: the upstream scripts feed these prompts to the model as plain text; lorekv wraps them in the
tokenizer's chat template (:data:`CHAT`), as it does for the other instruction-following suites.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, ClassVar

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, Turn, answers_of, register, required_field

TEMPLATES: dict[str, str] = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",
    "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. "
    "I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "{context}\n\n{input}",
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n"
    "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",
    "longbook_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\n"
    "Question: {question}\nAnswer:",
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\n"
    "Values: [1, 4, 8]\n\nExpression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: {context}\nValues:",
    "code_run": "There is a function called {func} in the following Python code.\n\n{context}\n\n"
    "Please compute the exact value of {func_call}. The value of {func_call} is",
    "code_debug": "Following is a Python code where exactly one of the functions/methods has a deliberate error "
    "that makes it crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\n"
    "D. {OPTION_D}\n\nThe correct option is:",
    "longdialogue_qa_eng": "Below is a dialogue script where one random occurrence of a character name is replaced "
    'with "$$MASK$$", and you should try to guess who that character is.\n\n{context}\n\n'
    "The name that has been replaced with $$MASK$$ is likely",
}
"""The open-source models' templates, verbatim (``yarn_mistral_templates`` of ``src/prompt.py``)."""

MAX_NEW_TOKENS: dict[str, int] = {
    "passkey": 6,
    "number_string": 12,
    "kv_retrieval": 50,
    "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40,
    "longbook_qa_eng": 40,
    "longbook_qa_chn": 40,
    "longdialogue_qa_eng": 40,
    "math_find": 3,
    "math_calc": 30000,
    "code_run": 5,
    "code_debug": 5,
}
"""Answer lengths (``DATA_NAME_TO_MAX_NEW_TOKENS`` of ``src/eval_utils.py``)."""

METRICS: dict[str, str] = {
    "passkey": "infbench_passkey",
    "number_string": "infbench_passkey",  # get_score_one_number_string is the passkey scorer (first integer).
    "kv_retrieval": "infbench_kv_retrieval",
    "longbook_sum_eng": "infbench_longbook_sum_eng",
    "longbook_choice_eng": "infbench_longbook_choice_eng",
    "longbook_qa_eng": "infbench_longbook_qa_eng",
    "longbook_qa_chn": "infbench_longbook_qa_chn",
    "math_find": "infbench_math_find",
    "math_calc": "infbench_math_calc",
    "code_run": "infbench_code_run",
    "code_debug": "infbench_code_debug",
    "longdialogue_qa_eng": "infbench_longdialogue_qa_eng",
}
"""The metric of each task: ``get_score_one`` of ``src/compute_scores.py``, named by scorer."""

CHOICE_TASKS: tuple[str, ...] = ("longbook_choice_eng", "code_debug")
"""The tasks whose rows carry four ``options`` and whose gold answers are the option and its letter."""

LETTERS = "ABCD"
CHAT = True
"""Wrap prompts in the chat template (the upstream scripts do not; see the module docstring)."""

_FUNC_CALL = re.compile(r"func_[0-9]+\(-?[0-9]+\)")  # the call code_run asks about, as create_prompt finds it
_TARGET = re.compile(r"The .+ of")  # the number math_find asks for ("The largest number of the list")


def task_of_file(source: str, known: tuple[str, ...]) -> str:
    """The task a file holds: its name without the extension, less a numeric tail (``_1000``) when
    that leaves a known task name (upstream's shortened copies, ``longdialogue_qa_eng_1000.jsonl``)."""
    stem = PurePath(source).name.split(".")[0]
    if stem in known:
        return stem
    head, _, tail = stem.rpartition("_")
    return head if tail.isdigit() and head in known else stem


@register
class InfiniteBench(SuiteFormat):
    """InfiniteBench rows: one context, one question; the task comes from the file name."""

    name: ClassVar[str] = "infinitebench"
    suite: ClassVar[str] = "InfiniteBench"
    fields: ClassVar[tuple[str, ...]] = ("context", "input", "answer")
    subtasks: ClassVar[tuple[str, ...]] = tuple(TEMPLATES)

    def subtask_hint(self, source: str) -> str | None:
        """The task named by the file (``longbook_qa_eng.jsonl`` -> ``longbook_qa_eng``)."""
        return task_of_file(source, self.subtasks)

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        if subtask is None:
            raise RowError("no InfiniteBench task: name the file after one (passkey.jsonl) or give the sub-task")
        if subtask not in TEMPLATES:
            raise RowError(f"unknown InfiniteBench task {subtask!r}; known: {', '.join(TEMPLATES)}")
        context = required_field(row, "context")
        query = required_field(row, "input")
        values: dict[str, str] = {"input": query, "question": query}
        if subtask in CHOICE_TASKS:
            options = _options(row)
            values.update({f"OPTION_{letter}": option for letter, option in zip(LETTERS, options, strict=True)})
            answers = _choice_answers(required_field(row, "answer", (list, str)), options)
        elif subtask == "math_calc":
            answers = _sequence_answers(required_field(row, "answer", (list, str, int, float)))
        else:
            answers = answers_of(required_field(row, "answer", (list, str, int, float)), "answer")
        if subtask == "code_run":
            found = _FUNC_CALL.search(query)
            if found is None:
                raise RowError("field 'input' names no call like func_12(-3), which code_run's prompt needs")
            values["func_call"] = found.group(0)
            values["func"] = values["func_call"].split("(")[0]
        if subtask == "math_find":
            found = _TARGET.search(query)
            if found is None:
                raise RowError("field 'input' has no 'The ... of' phrase, which math_find's prompt needs")
            values["prefix"] = f"What is {found.group(0).lower()[:-3]} in the following list?"
        head, tail = TEMPLATES[subtask].split("{context}")
        question = tail.lstrip()
        return Record(
            subtask=subtask,
            context=head.format(**values) + context,
            turns=(Turn(question=question.format(**values), answers=answers),),
            separator=tail[: len(tail) - len(question)],
            metric=METRICS[subtask],
            max_new_tokens=MAX_NEW_TOKENS[subtask],
            chat=CHAT,
            truncate=True,
        )


def _options(row: Mapping[str, Any]) -> list[str]:
    """The four options of a choice row, as text."""
    options = required_field(row, "options", list)
    if len(options) < len(LETTERS) or not all(isinstance(o, str) for o in options):
        raise RowError(f"field 'options' must be a list of {len(LETTERS)} strings, got {len(options)} items")
    return options[: len(LETTERS)]


def _choice_answers(answer: Any, options: list[str]) -> tuple[str, ...]:
    """The option text and its letter, as ``get_answer`` in ``src/eval_utils.py`` makes them: from the
    option text (a string or a one-item list) or an ``[option, letter]`` pair."""
    items = answers_of(answer, "answer")
    if len(items) == 2 and items[1] in LETTERS:
        return items
    if len(items) != 1:
        raise RowError(f"field 'answer' must be one option or an [option, letter] pair, got {len(items)} items")
    if items[0] not in options:
        raise RowError(f"field 'answer' {items[0]!r} is not one of the field 'options'")
    return (items[0], LETTERS[options.index(items[0])])


def _sequence_answers(answer: Any) -> tuple[str, ...]:
    """math_calc's gold: the expression's intermediate values in order (a list of numbers, possibly
    wrapped in a one-item list as ``get_score_one_math_calc`` allows), as one answer ``"[v1, v2, ...]"``:
    the metric scores the prediction's correct prefix of the whole sequence."""
    if isinstance(answer, list) and answer and isinstance(answer[0], list):
        answer = answer[0]
    return ("[" + ", ".join(answers_of(answer, "answer")) + "]",)
