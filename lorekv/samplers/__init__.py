"""Samplers: which queries stand for "the future"?

Importing this package registers every sampler in :data:`SAMPLERS`:
``greedy``, ``temperature``, ``nucleus``, ``adaptive``, ``prompt_window``, ``oracle``, ``kvzip``, ``lookahead``,
and for query-agnostic use ``questions``, ``partial_kvzip``, ``strided_kvzip`` and ``mixture``.
"""

from lorekv.samplers.adaptive import AdaptiveConfig, AdaptiveSampler
from lorekv.samplers.base import (
    SAMPLERS,
    Rollout,
    Sampler,
    SamplerConfig,
    assistant_suffix,
    check_futures,
    prepend_last_prompt_query,
)
from lorekv.samplers.greedy import GreedyConfig, GreedySampler
from lorekv.samplers.kvzip import KVzipConfig, KVzipSampler
from lorekv.samplers.lookahead import LookaheadConfig, LookaheadSampler
from lorekv.samplers.mixture import MixtureConfig, MixtureSampler
from lorekv.samplers.nucleus import NucleusConfig, NucleusSampler
from lorekv.samplers.oracle import OracleConfig, OracleSampler
from lorekv.samplers.partial_kvzip import PartialKVzipConfig, PartialKVzipSampler
from lorekv.samplers.prompt_window import PromptWindowConfig, PromptWindowSampler
from lorekv.samplers.questions import QuestionsConfig, QuestionsSampler
from lorekv.samplers.strided_kvzip import StridedKVzipConfig, StridedKVzipSampler
from lorekv.samplers.temperature import TemperatureConfig, TemperatureSampler

__all__ = [
    "SAMPLERS",
    "AdaptiveConfig",
    "AdaptiveSampler",
    "GreedyConfig",
    "GreedySampler",
    "KVzipConfig",
    "KVzipSampler",
    "LookaheadConfig",
    "LookaheadSampler",
    "MixtureConfig",
    "MixtureSampler",
    "NucleusConfig",
    "NucleusSampler",
    "OracleConfig",
    "OracleSampler",
    "PartialKVzipConfig",
    "PartialKVzipSampler",
    "PromptWindowConfig",
    "PromptWindowSampler",
    "QuestionsConfig",
    "QuestionsSampler",
    "Rollout",
    "Sampler",
    "SamplerConfig",
    "StridedKVzipConfig",
    "StridedKVzipSampler",
    "TemperatureConfig",
    "TemperatureSampler",
    "assistant_suffix",
    "check_futures",
    "prepend_last_prompt_query",
]
