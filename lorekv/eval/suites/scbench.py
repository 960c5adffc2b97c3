"""SCBench: one shared context, several questions on it, read from the suite's own JSONL files.

SCBench (Li et al., "SCBench: A KV Cache-Centric Analysis of Long-Context Methods",
https://arxiv.org/abs/2412.10319, code in https://github.com/microsoft/MInference under ``scbench/``,
data ``microsoft/SCBench`` on the Hugging Face hub) ships one file per task (``scbench_kv.jsonl``, ...);
a row holds ``context`` (some rows ``input`` instead, as ``create_multiturn_prompt`` accepts) and
``multi_turns``, a list of ``{input, answer}`` with ``options`` for ``scbench_choice_eng``.

One row is one :class:`Record`: the context once, one :class:`Turn` per entry of ``multi_turns``.

Turns are independent here. SCBench's multi-turn mode (``create_multiturn_prompt`` in
``scbench/eval_utils.py``, the default of ``scbench/run_scbench.py``) puts each earlier turn's gold answer
into the history as an assistant message before the next question; lorekv does not: every turn is asked
on the same compressed context alone, as in SCBench's "same context, different query" mode
(``--same_context_different_query``, ``create_scdq_prompt``), whose query texts are the same as the
ones used here.

Where each part comes from, in ``scbench/`` of the upstream repository:

- the context and the first question: ``multiturn_templates`` in ``eval_utils.py``, verbatim, split at
  ``{context}`` (the head and the context, the separator, the first question);
- every later question: ``multiturn_follow_up_templates_in_chat_tempate`` in ``eval_utils.py``, verbatim
  (the follow-up prompt of the chat-template runs, which ``scripts/run_all_tasks.sh`` does with
  ``--use_chat_template``); ``scbench_summary``'s later turns start their answer with ``"This paper"``
  (:attr:`Turn.answer_prefix`), as ``create_multiturn_prompt`` appends it after the generation prompt;
- ``scbench_mf``'s ``{prefix}`` (``What is <the target>?``) from each turn's ``input``, as
  ``create_multiturn_prompt`` derives it: the first turn's goes before the context, each later turn's
  before its question;
- answer lengths: ``DATA_NAME_TO_MAX_NEW_TOKENS`` in ``eval_utils.py``;
- gold answers: ``get_ground_truth`` in ``eval_utils.py`` (the choice task scores against the option and
  its letter);
- metrics: ``compute_scores.py`` maps each task to a scorer (``Multiturnbench_to_Infinitebench`` and
  ``get_score_one``); :data:`METRICS` names them;
- truncation: ``get_pred`` in ``run_scbench.py`` cuts the first prompt in the middle to fit: ``truncate=True``.

Not read: ``scbench_repoqa`` (its scorer compares the answer with every function of the repository,
collected across rows), ``scbench_summary_with_needles``, ``scbench_repoqa_and_kv`` and
``scbench_kv_compressible`` (each turn has its own task, answer length and scorer, which a :class:`Record`
cannot say); :data:`UNSUPPORTED` says why for each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, ClassVar

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, Turn, answers_of, register, required_field

TEMPLATES: dict[str, str] = {
    "scbench_passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information.\n\n{context}\n\n{input}",
    "scbench_kv": "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "{context}\n\n{input}",
    "scbench_kv_hard": "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "{context}\n\n{input}",
    "scbench_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n"
    "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe the correct answer is",
    "scbench_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\n"
    "Question: {question}\nAnswer:",
    "scbench_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "scbench_mf": "{prefix}\n\n{context}\n\n{input}",
    "scbench_summary": "{context}\n\n{input}",
    "scbench_vt": "{context}\n\n{input}",
    "scbench_many_shot": "{context}\n\n{input}",
    "scbench_hashhop": "{context}\n\n{input}",
    "scbench_prefix_suffix": "{context}\n\n{input}",
}
"""The first turn's prompt (``multiturn_templates`` of ``scbench/eval_utils.py``), verbatim."""

FOLLOW_UPS: dict[str, str] = {
    "scbench_passkey": "{input}",
    "scbench_kv": "{input}",
    "scbench_kv_hard": "{input}",
    "scbench_choice_eng": "Question: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\n"
    "The the correct answer is",
    "scbench_qa_eng": "Question: {question}\nAnswer:",
    "scbench_qa_chn": "问题：{question}\n答案：",
    "scbench_mf": "{prefix}\n\n{input}",
    "scbench_summary": "{input}",
    "scbench_vt": "{input}",
    "scbench_many_shot": "{input}",
    "scbench_hashhop": "{input}",
    "scbench_prefix_suffix": "{input}",
}
"""Each later turn's question (``multiturn_follow_up_templates_in_chat_tempate``), verbatim."""

FOLLOW_UP_ANSWER_PREFIX: dict[str, str] = {"scbench_summary": "This paper"}
"""What ``create_multiturn_prompt`` appends after a later turn's generation prompt."""

MAX_NEW_TOKENS: dict[str, int] = {
    "scbench_choice_eng": 40,
    "scbench_qa_eng": 40,
    "scbench_qa_chn": 40,
    "scbench_kv": 150,
    "scbench_kv_hard": 150,
    "scbench_mf": 5,
    "scbench_hashhop": 150,
    "scbench_prefix_suffix": 150,
    "scbench_passkey": 15,
    "scbench_summary": 200,
    "scbench_vt": 30,
    "scbench_many_shot": 10,
}
"""``DATA_NAME_TO_MAX_NEW_TOKENS`` of ``scbench/eval_utils.py``."""

METRICS: dict[str, str] = {
    # SCBench's kv_retrieval scorer: the gold value is a (case-sensitive) substring of the answer;
    # InfiniteBench's splits the answer into words instead, hence a metric of its own.
    "scbench_kv": "scbench_kv_retrieval",
    "scbench_kv_hard": "scbench_kv_retrieval",
    "scbench_hashhop": "scbench_kv_retrieval",
    "scbench_prefix_suffix": "scbench_kv_retrieval",
    "scbench_passkey": "infbench_passkey",
    "scbench_choice_eng": "infbench_longbook_choice_eng",
    # Multiturnbench_to_Infinitebench maps scbench_qa_eng to SCBench's longdialogue_qa_eng scorer: any gold
    # answer, case-folded, inside the case-folded answer; that is string match "part".
    "scbench_qa_eng": "part",
    "scbench_many_shot": "part",
    "scbench_qa_chn": "infbench_longbook_qa_chn",
    "scbench_mf": "infbench_math_find",
    "scbench_summary": "infbench_longbook_sum_eng",
    "scbench_vt": "all",  # string_match_all
}
"""The scorer of each task (``compute_scores.py``), by lorekv metric name."""

UNSUPPORTED: dict[str, str] = {
    "scbench_repoqa": "its scorer needs every function of the repository across rows",
    "scbench_summary_with_needles": "each turn has its own task, answer length and scorer",
    "scbench_repoqa_and_kv": "each turn has its own task, answer length and scorer",
    "scbench_kv_compressible": "each turn has its own task, scored apart",
}

LETTERS = "ABCD"
CHAT = True
"""Wrap prompts in the chat template, as SCBench's runs do (``--use_chat_template``)."""

_TARGET = re.compile(r"The .+ is")  # what scbench_mf asks for ("The largest number in the list is")


@register
class SCBench(SuiteFormat):
    """SCBench rows: one shared context, one turn per entry of ``multi_turns``, answered independently."""

    name: ClassVar[str] = "scbench"
    suite: ClassVar[str] = "SCBench"
    fields: ClassVar[tuple[str, ...]] = ("multi_turns",)
    subtasks: ClassVar[tuple[str, ...]] = tuple(TEMPLATES)

    def subtask_hint(self, source: str) -> str | None:
        """The task named by the file (``scbench_kv.jsonl`` -> ``scbench_kv``)."""
        return PurePath(source).name.split(".")[0]

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        if subtask is None:
            raise RowError("no SCBench task: name the file after one (scbench_kv.jsonl) or give the sub-task")
        if subtask in UNSUPPORTED:
            raise RowError(f"SCBench task {subtask!r} is not supported: {UNSUPPORTED[subtask]}")
        if subtask not in TEMPLATES:
            raise RowError(f"unknown SCBench task {subtask!r}; known: {', '.join(TEMPLATES)}")
        context = required_field(row, "context" if "context" in row or "input" not in row else "input")
        entries = required_field(row, "multi_turns", list)
        if not entries:
            raise RowError("field 'multi_turns' is empty: a row needs at least one turn")
        filled = [_values(entry, i, subtask) for i, entry in enumerate(entries)]
        head, tail = TEMPLATES[subtask].split("{context}")
        first = tail.lstrip()
        turns = []
        for i, (values, answers) in enumerate(filled):
            template = first if i == 0 else FOLLOW_UPS[subtask]
            prefix = "" if i == 0 else FOLLOW_UP_ANSWER_PREFIX.get(subtask, "")
            turns.append(Turn(question=template.format(**values), answers=answers, answer_prefix=prefix))
        return Record(
            subtask=subtask,
            context=head.format(**filled[0][0]) + context,
            turns=tuple(turns),
            separator=tail[: len(tail) - len(first)],
            metric=METRICS[subtask],
            max_new_tokens=MAX_NEW_TOKENS[subtask],
            chat=CHAT,
            truncate=True,
        )


def _values(entry: Any, index: int, subtask: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """The template values and the gold answers of one ``multi_turns`` entry."""
    where = f"'multi_turns' item {index}"
    if not isinstance(entry, dict):
        raise RowError(f"field {where} must be a dict, got {type(entry).__name__}")
    for key in ("input", "answer"):
        if key not in entry:
            raise RowError(f"field {where} has no {key!r}")
    query = entry["input"]
    if not isinstance(query, str):
        raise RowError(f"field {where}: 'input' must be str, got {type(query).__name__}")
    values = {"input": query, "question": query}
    answers = answers_of(entry["answer"], f"multi_turns[{index}].answer")
    if subtask == "scbench_choice_eng":
        options = entry.get("options")
        if not isinstance(options, list) or len(options) < len(LETTERS) or not all(isinstance(o, str) for o in options):
            raise RowError(f"field {where}: 'options' must be a list of {len(LETTERS)} strings")
        values.update({f"OPTION_{letter}": option for letter, option in zip(LETTERS, options, strict=False)})
        if len(answers) != 1 or answers[0] not in options[: len(LETTERS)]:
            raise RowError(f"field {where}: 'answer' must be one of its 'options'")
        answers = (answers[0], LETTERS[options.index(answers[0])])
    if subtask == "scbench_mf":
        found = _TARGET.search(query)
        if found is None:
            raise RowError(f"field {where}: 'input' has no 'The ... is' phrase, which scbench_mf's prompt needs")
        values["prefix"] = f"What is {found.group(0).lower()[:-3]}?"
    return values, answers
