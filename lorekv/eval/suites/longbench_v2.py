"""LongBench v2 rows: four-choice questions over long contexts, scored by the extracted letter.

LongBench v2 (Bai et al., https://arxiv.org/abs/2412.15204; code at
https://github.com/THUDM/LongBench, ``pred.py`` and ``prompts/0shot.txt``) rows hold
``_id``, ``domain``, ``sub_domain``, ``difficulty`` (easy/hard), ``length``
(short/medium/long), ``question``, ``choice_A`` .. ``choice_D``, ``answer`` (a letter) and
``context``. The prompt is the zero-shot template with every field stripped, asked as one user
turn; a prompt over the model's limit is cut in the middle; the answer is the letter after
"The correct answer is" (metric ``choice``), 128 new tokens. Results are averaged overall and
by difficulty and length (``result.py``). LongBench v2 samples at temperature 0.1; lorekv
decodes greedily.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lorekv.eval.suites.record import Record, RowError, SuiteFormat, Turn, register, required_field

TEMPLATE_HEAD = "Please read the following text and answer the question below.\n\n<text>\n"
TEMPLATE_TAIL = (
    "\n</text>\n\nWhat is the correct answer to this question: {question}\nChoices:\n(A) {A}\n(B) {B}\n(C) {C}\n"
    '(D) {D}\n\nFormat your response as follows: "The correct answer is (insert answer here)".'
)
"""``prompts/0shot.txt``, split where the document ends ($DOC$, $Q$, $C_A$.. as fields)."""

LETTERS = ("A", "B", "C", "D")


@register
class LongBenchV2(SuiteFormat):
    """LongBench v2 rows: one task (its accuracy is over all questions), tagged with ``domain``,
    ``difficulty`` and ``length``."""

    name = "longbench_v2"
    suite = "LongBench v2"
    fields = ("question", "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context")

    def parse(self, row: Mapping[str, Any], subtask: str | None) -> Record:
        answer = required_field(row, "answer")
        if answer not in LETTERS:
            raise RowError(f"field 'answer' must be one of {', '.join(LETTERS)}, got {answer!r}")
        choices = {letter: required_field(row, f"choice_{letter}").strip() for letter in LETTERS}
        question = TEMPLATE_TAIL.format(question=required_field(row, "question").strip(), **choices)
        tags = {key: row[key] for key in ("domain", "difficulty", "length") if isinstance(row.get(key), str)}
        return Record(
            subtask="all",
            context=TEMPLATE_HEAD + required_field(row, "context").strip(),
            turns=(Turn(question, (answer,)),),
            metric="choice",
            max_new_tokens=128,
            chat=True,
            truncate=True,
            tags=tags,
        )
