"""LooGLE: long documents with several questions each, read from the suite's own JSONL files.

LooGLE (Li et al., "LooGLE: Can Long-Context Language Models Understand Long Contexts?",
https://arxiv.org/abs/2311.04939, https://github.com/bigai-nlco/LooGLE) ships one file per task
(``LooGLE-testdata/shortdep_qa.jsonl``, ``longdep_qa.jsonl``, ``shortdep_cloze.jsonl``,
``longdep_summarization.jsonl``); a row holds ``input`` (the document), ``title``, ``qa_pairs`` and
``output``. ``qa_pairs`` is a list of ``{Q, A, S, type}`` (question, answer, supporting evidence, question
type) or, as the files hold it, a string with the Python literal of that list; summarization rows hold
``"none"`` there and the gold summary in ``output``.

One row is one :class:`Record`: the document once, one :class:`Turn` per question, so that every
question of a document is answered from one compression of it. Upstream asks each question with the
whole prompt rebuilt around the document (``get_pred`` in ``Prediction/pred_opensource_models.py``);
the prompt text of each question is the same.

Where each part comes from, in the upstream repository:

- prompt templates: ``config/task2prompt.json``, verbatim (``{input}`` the document, ``{Q}`` the question);
- answer lengths: ``config/task2maxlen.json``;
- truncation: ``get_pred`` in ``Prediction/pred_opensource_models.py`` cuts a prompt longer than
  ``--max_length`` tokens in the middle, keeping both halves: ``truncate=True``;
- metrics: ``Evaluation/automatic_metrics.py``: ROUGE-L for the QA and summarization tasks
  (``get_rouge_score``, which reports recall), exact/partial match of the masked entities for cloze
  (``get_exact_match``, ``get_partial_match``); named ``loogle_rouge_l`` and ``loogle_cloze_exact`` here.

A cloze answer is a mapping from each ``<mask-n>`` to its entity; the gold answer of the :class:`Turn`
is that mapping as JSON text (``json.dumps``, non-ASCII kept), which ``loogle_cloze_exact`` reads back.

Chat: the open-source script feeds the prompt as plain text; lorekv wraps it in the tokenizer's chat
template (:data:`CHAT`), as it does for the other instruction-following suites.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, ClassVar

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, Turn, register, required_field

TEMPLATES: dict[str, str] = {
    "shortdep_qa": "Please answer the question based on the long texts below. \n{input}\nQuestion: {Q}\nAnswer: ",
    "longdep_qa": "Please answer the question based on the long texts below. \n{input}\nQuestion: {Q}\nAnswer: ",
    "longdep_summarization": "Please generate a summary of the below paper. \n{input}\n Summarization: ",
    "shortdep_cloze": "Please fill in the clozes based on the given long texts below. Each of the placeholder "
    "'<mask-n>' in the question could be an entity of Person, Location or Organiocation. The same masks represent "
    "the same entity. Output a json format answer, for example: {{'<mask-0>': 'Bob', '<mask-1>': 'Gorrosion "
    "Magazine','<mask-2>': 'Bethel Horizon'}}\n{input}\n Question: {Q} What are the masked entities? \nAnswer:",
}
"""``config/task2prompt.json``, verbatim (``str.format`` templates: ``{{``/``}}`` are literal braces)."""

MAX_NEW_TOKENS: dict[str, int] = {
    "shortdep_qa": 300,
    "longdep_qa": 500,
    "longdep_summarization": 500,
    "shortdep_cloze": 50,
}
"""``config/task2maxlen.json``."""

METRICS: dict[str, str] = {
    "shortdep_qa": "loogle_rouge_l",
    "longdep_qa": "loogle_rouge_l",
    "longdep_summarization": "loogle_rouge_l",
    "shortdep_cloze": "loogle_cloze_exact",
}

SUMMARIZATION = "longdep_summarization"
CLOZE = "shortdep_cloze"
CHAT = True
"""Wrap prompts in the chat template (the open-source script does not; see the module docstring)."""


@register
class LooGLE(SuiteFormat):
    """LooGLE rows: one document, one turn per question (one turn, the summary, for summarization)."""

    name: ClassVar[str] = "loogle"
    suite: ClassVar[str] = "LooGLE"
    fields: ClassVar[tuple[str, ...]] = ("input",)
    subtasks: ClassVar[tuple[str, ...]] = tuple(TEMPLATES)

    def subtask_hint(self, source: str) -> str | None:
        """The task named by the file (``shortdep_qa.jsonl`` -> ``shortdep_qa``)."""
        return PurePath(source).name.split(".")[0]

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        if subtask is None:
            raise RowError("no LooGLE task: name the file after one (shortdep_qa.jsonl) or give the sub-task")
        if subtask not in TEMPLATES:
            raise RowError(f"unknown LooGLE task {subtask!r}; known: {', '.join(TEMPLATES)}")
        document = required_field(row, "input")
        head, tail = TEMPLATES[subtask].split("{input}")
        question = tail.lstrip()
        if subtask == SUMMARIZATION:
            summary = required_field(row, "output")
            if not summary.strip():
                raise RowError("field 'output' is empty: a summarization row needs its gold summary")
            turns = (Turn(question=question.format(), answers=(summary,)),)
        else:
            turns = tuple(
                Turn(question=question.format(Q=q), answers=(a,)) for q, a in _pairs(row, cloze=subtask == CLOZE)
            )
        return Record(
            subtask=subtask,
            context=head.format() + document,
            turns=turns,
            separator=tail[: len(tail) - len(question)],
            metric=METRICS[subtask],
            max_new_tokens=MAX_NEW_TOKENS[subtask],
            chat=CHAT,
            truncate=True,
        )


def _pairs(row: Mapping[str, Any], cloze: bool) -> list[tuple[str, str]]:
    """The (question, gold answer) pairs of ``qa_pairs``: a list, or the text of a Python literal list
    (read with ``ast.literal_eval``, never evaluated); a cloze answer, a mask -> entity mapping, as JSON."""
    value = required_field(row, "qa_pairs", (list, str))
    if isinstance(value, str):
        if value.strip().lower() == "none":
            raise RowError("field 'qa_pairs' is 'none': only longdep_summarization rows have no questions")
        try:
            value = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
            raise RowError(f"field 'qa_pairs' is not a Python literal list: {type(error).__name__}") from None
    if not isinstance(value, list):
        raise RowError(f"field 'qa_pairs' must be a list of {{Q, A}} dicts, got {type(value).__name__}")
    if not value:
        raise RowError("field 'qa_pairs' is empty: a row needs at least one question")
    pairs = []
    for i, pair in enumerate(value):
        if not isinstance(pair, dict):
            raise RowError(f"field 'qa_pairs' item {i} must be a dict, got {type(pair).__name__}")
        for key in ("Q", "A"):
            if key not in pair:
                raise RowError(f"field 'qa_pairs' item {i} has no {key!r}")
        question, answer = pair["Q"], pair["A"]
        if not isinstance(question, str):
            raise RowError(f"field 'qa_pairs' item {i}: 'Q' must be str, got {type(question).__name__}")
        if cloze:
            if not isinstance(answer, dict) or not answer:
                raise RowError(f"field 'qa_pairs' item {i}: a cloze 'A' must be a non-empty mask -> entity dict")
            answer = json.dumps(answer, ensure_ascii=False)
        elif not isinstance(answer, str) or not answer:
            raise RowError(f"field 'qa_pairs' item {i}: 'A' must be a non-empty str")
        pairs.append((question, answer))
    return pairs
