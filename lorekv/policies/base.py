"""Policy interface: who keeps how many tokens?

A policy turns scores U (L, G, n) into a :class:`~lorekv.scores.Selection` under a budget
B = kept tokens per KV head *on average*, protected tokens (the first ``sink`` and the last
``recent`` candidates) included. B >= n keeps everything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import ValidationInfo, field_validator

from lorekv.registry import ComponentConfig, Registry
from lorekv.scores import Scores, Selection
from lorekv.validation import check_int_at_least


class PolicyConfig(ComponentConfig):
    """Base config of every policy.

    Attributes:
        budget: B, kept tokens per KV head on average (>= 1).
        sink: the first ``sink`` candidates are always kept (StreamingLLM's attention sinks), >= 0.
        recent: the last ``recent`` candidates are always kept, >= 0.

    Protected tokens count inside the budget: a head whose budget (below n) is smaller than
    its protected count min(sink + recent, n) is an error raised by ``select``.
    """

    budget: int
    sink: int = 0
    recent: int = 0

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: int) -> int:
        return check_int_at_least("budget", value, 1)

    @field_validator("sink", "recent")
    @classmethod
    def _protected(cls, value: int, info: ValidationInfo) -> int:
        return check_int_at_least(info.field_name, value, 0)


class Policy(ABC):
    config: PolicyConfig

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    @abstractmethod
    def select(self, scores: Scores) -> Selection:
        """Kept token indices per (layer, KV head): sorted, unique, in range."""


POLICIES: Registry[Policy] = Registry("policy")
