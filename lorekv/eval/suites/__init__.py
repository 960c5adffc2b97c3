"""The standard long-context benchmarks read from their own files and scored with their own metrics.

- :mod:`~lorekv.eval.suites.record`: what a row becomes (a context and its questions) and the format base class.
- :mod:`~lorekv.eval.suites.reader`: rows from files, folders and hub datasets, with their file and line.
- :mod:`~lorekv.eval.suites.task`: the grid task that reads a benchmark, and its samples (middle truncation).
- :mod:`~lorekv.eval.suites.metrics`: the suites' metrics.
- One module per suite's format: LongBench and LongBench-E, LongBench v2, RULER (its generated
  files and kvpress's unified form), InfiniteBench, LooGLE, SCBench, and a generic JSONL.
"""
