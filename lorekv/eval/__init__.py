"""Evaluation: task families, grids that share work, resumable results files, statistics and reports.

- :mod:`~lorekv.eval.tasks`: seeded RULER-style task families and their metrics.
- :mod:`~lorekv.eval.grid`: a grid config (models x methods x budgets x tasks x lengths x modes).
- :mod:`~lorekv.eval.shared`: every (method, budget) cell of one prompt from shared phases.
- :mod:`~lorekv.eval.harness`: running a grid (resume, shards, run header) and merging shards.
- :mod:`~lorekv.eval.results`: the resumable results file and the kept-token map's encoding.
- :mod:`~lorekv.eval.rows`: the row model (checks, sections, budget columns, cell accuracy).
- :mod:`~lorekv.eval.stats`, :mod:`~lorekv.eval.report`, :mod:`~lorekv.eval.figures`:
  intervals, the Markdown report and its figures.
"""

from lorekv.eval.grid import Budget, GridConfig, MethodSpec
from lorekv.eval.harness import EvalRow, merge, read_results, run_grid
from lorekv.eval.results import ResultsFile
from lorekv.eval.rows import FULL
from lorekv.eval.tasks import Sample, make_sample

__all__ = [
    "FULL",
    "Budget",
    "EvalRow",
    "GridConfig",
    "MethodSpec",
    "ResultsFile",
    "Sample",
    "make_sample",
    "merge",
    "read_results",
    "run_grid",
]
