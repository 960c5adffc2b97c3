"""Policy interface: who keeps how many tokens?

A policy turns scores U (L, G, n) into a :class:`~lorekv.scores.Selection` under a budget
B = kept tokens per KV head *on average*, protected tokens (the first ``sink`` and the last
``recent`` candidates) included. B >= n keeps everything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from lorekv.registry import ComponentConfig, Registry
from lorekv.scores import Scores, Selection


class PolicyConfig(ComponentConfig):
    """Base config of every policy.

    Attributes:
        budget: B, kept tokens per KV head on average (>= 1).
        sink: the first ``sink`` candidates are always kept (StreamingLLM's attention sinks).
        recent: the last ``recent`` candidates are always kept.
    """

    budget: int
    sink: int = 0
    recent: int = 0


class Policy(ABC):
    config: PolicyConfig

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    @abstractmethod
    def select(self, scores: Scores) -> Selection:
        """Kept token indices per (layer, KV head): sorted, unique, in range."""


POLICIES: Registry[Policy] = Registry("policy")
