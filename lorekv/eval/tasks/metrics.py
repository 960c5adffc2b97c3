"""RULER's answer metrics: case-insensitive substring matches of the gold answers in a prediction.

RULER (https://arxiv.org/abs/2404.06654) scores a generated answer by whether the gold strings
occur in it, not by exact match, because the model is free to surround them with words:

- ``string_match_all``: the fraction of the gold answers found (retrieval of several values,
  variable tracking, word counting tasks);
- ``string_match_part``: 1 if any gold answer is found, else 0 (question answering, where the
  gold answers are alternatives).

lorekv's long-output tasks add one for answers that must come in order:

- ``string_match_in_order``: the longest run of gold answers that occur, as whole words, in
  their gold order (list recall: an item written twice, or out of place, counts once).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence

Metric = Callable[[str, Sequence[str]], float]


def _check_answers(answers: Sequence[str]) -> None:
    if isinstance(answers, str) or len(answers) == 0:
        raise ValueError(f"answers must be a non-empty sequence of strings, got {answers!r}")


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """The fraction of ``answers`` that occur in ``prediction`` (case-insensitive), in [0, 1]."""
    _check_answers(answers)
    text = prediction.lower()
    return sum(answer.lower() in text for answer in answers) / len(answers)


def string_match_part(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if any of ``answers`` occurs in ``prediction`` (case-insensitive), else 0.0."""
    _check_answers(answers)
    text = prediction.lower()
    return float(any(answer.lower() in text for answer in answers))


def string_match_in_order(prediction: str, answers: Sequence[str]) -> float:
    """The longest subsequence of ``answers`` (distinct strings, in their gold order) whose
    members occur in ``prediction`` one after another, as whole words and case-insensitively,
    over ``len(answers)``, in [0, 1]: 1 for the list written back whole and in order, and an
    item skipped, repeated or misplaced costs only itself."""
    _check_answers(answers)
    text = prediction.lower()
    found = sorted(
        (m.start(), -k)  # at one position, the later gold item first: a strictly increasing run takes one
        for k, answer in enumerate(answers)
        for m in re.finditer(rf"(?<!\w){re.escape(answer.lower())}(?!\w)", text)
    )
    tails: list[int] = []  # tails[j]: the smallest gold index ending an increasing run of j + 1
    for _, negative in found:
        j = bisect.bisect_left(tails, -negative)
        tails[j : j + 1] = [-negative]
    return len(tails) / len(answers)


METRICS: dict[str, Metric] = {"all": string_match_all, "part": string_match_part, "in_order": string_match_in_order}
"""Metric name (a :class:`~lorekv.eval.tasks.sample.Sample`'s ``metric``) -> function."""
