"""Seeded synthetic long-context tasks after RULER (https://arxiv.org/abs/2404.06654).

Importing this package registers the families in :data:`TASKS`: ``niah_single``,
``niah_multikey``, ``niah_multivalue``, ``niah_multiquery`` (retrieval), ``variable_tracking``
(multi-hop tracing), ``common_words`` and ``frequent_words`` (aggregation), ``qa``
(question answering over the reference manual's prose) and ``list_recall`` (a long
output: a numbered list written back in order). :func:`make_sample` builds a sample
whose chat prompt fills between 90% and 100% of a token length.
"""

from lorekv.eval.tasks import common_words, frequent_words, list_recall, niah, qa, variable_tracking  # noqa: F401  (registration)
from lorekv.eval.tasks.base import TASKS, TaskConfig, TaskFamily, check_length, make_sample, parse_task, sample_seed
from lorekv.eval.tasks.metrics import METRICS, string_match_all, string_match_in_order, string_match_part
from lorekv.eval.tasks.sample import Sample

__all__ = [
    "METRICS",
    "TASKS",
    "Sample",
    "TaskConfig",
    "TaskFamily",
    "check_length",
    "make_sample",
    "parse_task",
    "sample_seed",
    "string_match_all",
    "string_match_in_order",
    "string_match_part",
]
