"""Samplers: which queries stand for "the future"?

Importing this package registers every sampler in :data:`SAMPLERS`:
``greedy``, ``temperature``, ``nucleus``, ``prompt_window``, ``oracle``, ``kvzip`` and ``lookahead``.
"""

from lorekv.samplers.base import (
    SAMPLERS,
    Rollout,
    Sampler,
    SamplerConfig,
    check_futures,
    prepend_last_prompt_query,
)
from lorekv.samplers.greedy import GreedyConfig, GreedySampler
from lorekv.samplers.kvzip import KVzipConfig, KVzipSampler
from lorekv.samplers.lookahead import LookaheadConfig, LookaheadSampler
from lorekv.samplers.nucleus import NucleusConfig, NucleusSampler
from lorekv.samplers.oracle import OracleConfig, OracleSampler
from lorekv.samplers.prompt_window import PromptWindowConfig, PromptWindowSampler
from lorekv.samplers.temperature import TemperatureConfig, TemperatureSampler

__all__ = [
    "SAMPLERS",
    "GreedyConfig",
    "GreedySampler",
    "KVzipConfig",
    "KVzipSampler",
    "LookaheadConfig",
    "LookaheadSampler",
    "NucleusConfig",
    "NucleusSampler",
    "OracleConfig",
    "OracleSampler",
    "PromptWindowConfig",
    "PromptWindowSampler",
    "Rollout",
    "Sampler",
    "SamplerConfig",
    "TemperatureConfig",
    "TemperatureSampler",
    "check_futures",
    "prepend_last_prompt_query",
]
