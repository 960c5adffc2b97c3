"""Policies: who keeps how many tokens?

Importing this package registers ``uniform``, ``per_layer``, ``per_head``, ``global`` and ``threshold`` in
:data:`POLICIES`.
"""

from lorekv.policies.base import POLICIES, Policy, PolicyConfig
from lorekv.policies.global_threshold import GlobalConfig, GlobalPolicy
from lorekv.policies.per_head import PerHeadConfig, PerHeadPolicy
from lorekv.policies.per_layer import PerLayerConfig, PerLayerPolicy, adaptive_budgets, pyramid_budgets
from lorekv.policies.threshold import ThresholdConfig, ThresholdPolicy
from lorekv.policies.uniform import UniformConfig, UniformPolicy

__all__ = [
    "POLICIES",
    "GlobalConfig",
    "GlobalPolicy",
    "PerHeadConfig",
    "PerHeadPolicy",
    "PerLayerConfig",
    "PerLayerPolicy",
    "Policy",
    "PolicyConfig",
    "ThresholdConfig",
    "ThresholdPolicy",
    "UniformConfig",
    "UniformPolicy",
    "adaptive_budgets",
    "pyramid_budgets",
]
