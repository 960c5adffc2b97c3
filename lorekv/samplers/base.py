"""Sampler interface: which queries stand for "the future"?

A sampler decides *what* the future is (greedy, sampled, teacher-forced, or the prompt's
own last queries); the model work of producing it is done by a :class:`Rollout`, which the
pipeline implements over a prefilled model. Keeping the two apart lets samplers be tested
without a model and lets the pipeline batch the M futures in one forward pass per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from lorekv.registry import ComponentConfig, Registry
from lorekv.token_rules import TokenRule
from lorekv.trajectories import Trajectories


class Rollout(Protocol):
    """Model-side services a sampler draws on; all start from the prefilled prompt."""

    def decode(self, rule: TokenRule, num_futures: int, num_tokens: int) -> Trajectories:
        """Extend the prompt M times by T tokens chosen by ``rule``, capturing the queries."""
        ...

    def teacher_force(self, token_ids: torch.Tensor) -> Trajectories:
        """Feed the given (M, T) long continuations after the prompt, capturing the queries.

        ``token_ids`` may arrive on the CPU; the rollout moves it to the model's device.
        """
        ...

    def prompt_window(self, window: int) -> Trajectories:
        """The queries of the last ``window`` prompt tokens, as captured during prefill."""
        ...

    def generator(self, seed: int) -> torch.Generator:
        """A generator on the model's device, seeded with ``seed``."""
        ...


class SamplerConfig(ComponentConfig):
    """Base config of every sampler."""


class Sampler(ABC):
    """Produces the futures whose queries the scorer will use."""

    config: SamplerConfig

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config

    @property
    def prefill_window(self) -> int:
        """How many trailing prompt queries the prefill must capture for this sampler."""
        return 0

    @abstractmethod
    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures (M, T) with the attention of every evictable layer."""


def check_futures(trajectories: Trajectories, num_futures: int, num_tokens: int) -> Trajectories:
    """Return ``trajectories`` after checking the rollout produced (num_futures, num_tokens).

    Catches a rollout that silently dropped futures or stopped early (e.g. at EOS), which
    would otherwise change M or T behind the scorer's and aggregator's back.
    """
    got = (trajectories.num_futures, trajectories.num_tokens)
    if got != (num_futures, num_tokens):
        raise ValueError(f"rollout returned futures of shape {got}, expected ({num_futures}, {num_tokens})")
    return trajectories


SAMPLERS: Registry[Sampler] = Registry("sampler")
