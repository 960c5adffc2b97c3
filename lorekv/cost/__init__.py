"""The cost benchmark (``lorekv bench``): compression against transformers' own prefill and
SnapKV, phases, scorers alone, memory, growth exponents, decoding speed and batch throughput,
in one process.

- :mod:`~lorekv.cost.config`: :class:`BenchConfig`, every option validated before a model loads.
- :mod:`~lorekv.cost.measure`: repeated timings and medians, differenced decode timings, the
  peak-memory meter, the growth exponent fit.
- :mod:`~lorekv.cost.prompts`: prompts of exactly n tokens (a needle task, or random token ids for a
  model without a tokenizer), ragged left-padded batches of them.
- :mod:`~lorekv.cost.baselines`: transformers' own decode steps and ``generate``.
- :mod:`~lorekv.cost.run`: the measurements (:func:`run_bench`), ratios, growth.
- :mod:`~lorekv.cost.report`: the table on screen and the JSON file.
"""

from lorekv.cost.config import BenchConfig, known_context, parse_ints, parse_names
from lorekv.cost.report import default_out, read_results, render, write_results
from lorekv.cost.run import run_bench

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
