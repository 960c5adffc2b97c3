"""RULER's answer metrics: case-insensitive substring matches of the gold answers in a prediction.

RULER (https://arxiv.org/abs/2404.06654) scores a generated answer by whether the gold strings
occur in it, not by exact match, because the model is free to surround them with words:

- ``string_match_all``: the fraction of the gold answers found (retrieval of several values,
  variable tracking, word counting tasks);
- ``string_match_part``: 1 if any gold answer is found, else 0 (question answering, where the
  gold answers are alternatives).
"""

from __future__ import annotations

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


METRICS: dict[str, Metric] = {"all": string_match_all, "part": string_match_part}
"""Metric name (a :class:`~lorekv.eval.tasks.sample.Sample`'s ``metric``) -> function."""
