"""Evaluation: task families, grids that share work, resumable results files, statistics and reports.

- :mod:`~lorekv.eval.tasks`: seeded RULER-style task families and their metrics.
- :mod:`~lorekv.eval.grid`: a grid config (models x methods x budgets x tasks x lengths x modes).
- :mod:`~lorekv.eval.shared`: every (method, budget) cell of one prompt from shared phases.
- :mod:`~lorekv.eval.harness`: running a grid (resume, shards, run header) and merging shards.
- :mod:`~lorekv.eval.stats`, :mod:`~lorekv.eval.report`, :mod:`~lorekv.eval.figures`:
  intervals, the Markdown report and its figures.
- :mod:`~lorekv.eval.needle` and :mod:`~lorekv.eval.runner`: the original needle benchmark.
"""

from lorekv.eval.grid import Budget, GridConfig, MethodSpec
from lorekv.eval.harness import EvalRow, merge, read_results, run_grid
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
    "Budget",
    "EvalRow",
    "GridConfig",
    "MethodSpec",
    "MethodSummary",
    "NeedleRow",
    "NeedleTask",
    "ResultsFile",
    "context_and_question_ids",
    "make_task",
    "merge",
    "needle_results",
    "prompt_ids",
    "read_results",
    "resolve_methods",
    "run_grid",
    "run_method",
    "run_needle",
    "summarize_needle",
]
