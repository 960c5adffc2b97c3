"""Evaluation: tasks, results files that survive interruption, and the loops that run methods."""

from lorekv.eval.needle import NeedleTask, context_and_question_ids, make_task, prompt_ids
from lorekv.eval.results import ResultsFile
from lorekv.eval.runner import (
    FULL,
    MethodSummary,
    NeedleRow,
    needle_results,
    resolve_methods,
    run_method,
    run_needle,
    summarize_needle,
)

__all__ = [
    "FULL",
    "MethodSummary",
    "NeedleRow",
    "NeedleTask",
    "ResultsFile",
    "context_and_question_ids",
    "make_task",
    "needle_results",
    "prompt_ids",
    "resolve_methods",
    "run_method",
    "run_needle",
    "summarize_needle",
]
