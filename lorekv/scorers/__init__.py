"""Scorers: how much does one prompt token matter to one query?

Importing this package registers ``attention_mass``, ``loo``, ``projected_loo`` and
``recency`` in :data:`SCORERS`, the baselines' ``key_norm``, ``random`` and
``critical_mass``, ``expected_attention``, ``kvzip_plus``, R-KV's ``rkv`` and the learned
``surrogate``.
"""

from lorekv.scorers.attention import CausalAttention, causal_attention
from lorekv.scorers.attention_mass import AttentionMassConfig, AttentionMassScorer
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.scorers.critical_mass import CriticalMassConfig, CriticalMassScorer
from lorekv.scorers.expected_attention import ExpectedAttentionConfig, ExpectedAttentionScorer
from lorekv.scorers.key_norm import KeyNormConfig, KeyNormScorer
from lorekv.scorers.kv_head import KVHeadScorer
from lorekv.scorers.kvzip_plus import KVzipPlusConfig, KVzipPlusScorer
from lorekv.scorers.loo import LOOConfig, LOOScorer
from lorekv.scorers.projected_loo import ProjectedLOOConfig, ProjectedLOOScorer
from lorekv.scorers.random_scores import RandomConfig, RandomScorer
from lorekv.scorers.recency import RecencyConfig, RecencyScorer
from lorekv.scorers.redundancy import RedundancyConfig, RedundancyScorer
from lorekv.scorers.surrogate import SurrogateConfig, SurrogateMap, SurrogateScorer

__all__ = [
    "SCORERS",
    "AttentionMassConfig",
    "AttentionMassScorer",
    "CausalAttention",
    "LOOConfig",
    "LOOScorer",
    "ProjectedLOOConfig",
    "ProjectedLOOScorer",
    "RecencyConfig",
    "RecencyScorer",
    "RedundancyConfig",
    "RedundancyScorer",
    "Scorer",
    "ScorerConfig",
    "causal_attention",
    # baselines: Knorm, random, CriticalKV
    "CriticalMassConfig",
    "CriticalMassScorer",
    "ExpectedAttentionConfig",
    "ExpectedAttentionScorer",
    "KVHeadScorer",
    "KVzipPlusConfig",
    "KVzipPlusScorer",
    "KeyNormConfig",
    "KeyNormScorer",
    "RandomConfig",
    "RandomScorer",
    "SurrogateConfig",
    "SurrogateMap",
    "SurrogateScorer",
]
