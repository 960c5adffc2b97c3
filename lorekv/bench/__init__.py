"""The cost benchmark (``lorekv bench``): compression against transformers' own prefill and
SnapKV, phases, scorers alone, memory, growth exponents and decoding speed, in one process.

- :mod:`~lorekv.bench.config`: :class:`BenchConfig`, every option validated before a model loads.
- :mod:`~lorekv.bench.measure`: repeated timings and medians, differenced decode timings, the
  peak-memory meter, the growth exponent fit.
- :mod:`~lorekv.bench.prompts`: prompts of exactly n tokens.
- :mod:`~lorekv.bench.baselines`: transformers' own decode steps and ``generate``.
- :mod:`~lorekv.bench.run`: the measurements (:func:`run_bench`), ratios, growth, targets.
- :mod:`~lorekv.bench.report`: the table on screen and the JSON file.
"""

from lorekv.bench.config import BenchConfig, known_context, parse_ints, parse_names
from lorekv.bench.report import default_out, read_results, render, write_results
from lorekv.bench.run import run_bench

__all__ = [
    "BenchConfig",
    "default_out",
    "known_context",
    "parse_ints",
    "parse_names",
    "read_results",
    "render",
    "run_bench",
    "write_results",
]
