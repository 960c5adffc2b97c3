"""Aggregators: how the per-future scores U_m are combined into one U.

Importing this package registers ``mean``, ``logprob`` and ``reliability`` in
:data:`AGGREGATORS`.
"""

from lorekv.aggregators.base import AGGREGATORS, Aggregator, AggregatorConfig, check_future_inputs
from lorekv.aggregators.logprob import LogprobAggregator, LogprobConfig
from lorekv.aggregators.mean import MeanAggregator, MeanConfig
from lorekv.aggregators.reliability import ReliabilityAggregator, ReliabilityConfig

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "AggregatorConfig",
    "LogprobAggregator",
    "LogprobConfig",
    "MeanAggregator",
    "MeanConfig",
    "ReliabilityAggregator",
    "ReliabilityConfig",
    "check_future_inputs",
]
