"""Policy interface: who keeps how many tokens?

A policy turns scores U (L, G, n) into a :class:`~lorekv.scores.Selection` under a budget
B = kept candidates per KV head *on average*, protected tokens (the first ``sink`` and the last
``recent`` prompt tokens) included. B >= n keeps everything.

``recent`` counts prompt tokens, not candidates: in query-aware mode the prompt's last token is
re-fed through the compressed cache (``Scores.tail`` = 1), so it is the newest of the
``recent`` tokens and the policy protects the ``recent - 1`` candidates before it. A SnapKV
window of w tokens is then exactly the last w prompt tokens in both modes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from pydantic import ValidationInfo, field_validator

from lorekv.policies.topk import keep_all, protected_count
from lorekv.registry import ComponentConfig, Registry
from lorekv.scores import Scores, Selection
from lorekv.validation import check_int_at_least


class PolicyConfig(ComponentConfig):
    """Base config of every policy.

    Attributes:
        budget: B, kept tokens per KV head on average (>= 1).
        sink: the first ``sink`` candidates are always kept (StreamingLLM's attention sinks), >= 0.
        recent: the last ``recent`` prompt tokens are always kept, >= 0 (the re-fed last token
            of query-aware mode among them).

    Protected tokens count inside the budget: a head whose budget (below n) is smaller than
    its protected count is an error raised by ``select``.
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
    """Selects kept tokens. Subclasses implement :meth:`choose`; the base class runs the checks
    every policy shares and the identity case B >= n.

    Attributes:
        normalises_scores: the policy compares scores normalised per head, so they must be
            non-negative.
    """

    config: PolicyConfig

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    @property
    def normalises_scores(self) -> bool:
        return False

    def protected(self, scores: Scores) -> tuple[int, int]:
        """(sink, recent) counted in candidates: the ``scores.tail`` kept tokens after the
        candidates are the newest of the ``recent`` prompt tokens."""
        return self.config.sink, max(self.config.recent - scores.tail, 0)

    def check_budget(self, num_tokens: int, tail: int = 0) -> None:
        """Raise unless the protected tokens fit the budget for ``num_tokens`` candidates (and a
        ``tail`` of kept tokens after them): known before any score, so callers check it before
        any model work."""
        recent = max(self.config.recent - tail, 0)
        check_protected_fits(self.config.budget, num_tokens, self.config.sink, recent)

    def check(self, scores: Scores) -> None:
        """Scores finite (non-negative where normalised); the protected tokens fit the budget."""
        check_scores(scores, non_negative=self.normalises_scores)
        self.check_budget(scores.num_tokens, scores.tail)

    def select(self, scores: Scores) -> Selection:
        """Kept token indices per (layer, KV head): sorted, unique, in range; every candidate when B >= n.

        Args:
            scores: values (L, G, n), finite.
        """
        self.check(scores)
        if self.config.budget >= scores.num_tokens:
            return keep_all(scores)
        return self.choose(scores)

    @abstractmethod
    def choose(self, scores: Scores) -> Selection:
        """The selection for checked scores (L, G, n) and a budget B < n."""


def check_scores(scores: Scores, *, non_negative: bool) -> None:
    """Scores must be finite (and non-negative where a policy normalises them)."""
    values = scores.values
    if not values.is_floating_point():
        raise ValueError(f"scores.values must be a floating tensor, got {values.dtype}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("scores.values must be finite")
    if non_negative and bool((values < 0).any()):
        raise ValueError("scores.values must be non-negative for a policy that normalises scores per head")


def check_protected_fits(head_budget: int, num_tokens: int, sink: int, recent: int, where: str = "") -> None:
    """Raise unless a head with ``head_budget`` kept candidates can hold its protected ones.

    ``recent`` counts candidates here (see :meth:`Policy.protected`). A budget of n or more
    keeps every candidate and always fits.
    """
    p = protected_count(num_tokens, sink, recent)
    if head_budget < p:
        raise ValueError(
            f"budget {head_budget}{where} is smaller than the protected count "
            f"min(sink + recent, n) = min({sink} + {recent}, {num_tokens}) = {p} candidates; "
            "raise budget or lower sink/recent"
        )


POLICIES: Registry[Policy] = Registry("policy")
