"""Greedy sampler: the single most likely continuation (Lookahead/LAQ-style futures)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from lorekv import token_rules
from lorekv.samplers.base import SAMPLERS, BatchRollout, Rollout, Sampler, SamplerConfig, check_futures
from lorekv.trajectories import Trajectories


class GreedyConfig(SamplerConfig):
    """Config of :class:`GreedySampler`.

    Attributes:
        num_tokens: T, tokens per future (>= 1). There is always one future: greedy futures
            from the same prompt are identical, so M > 1 would only repeat work.
    """

    name: Literal["greedy"] = "greedy"
    num_tokens: int = Field(default=8, ge=1, strict=True)

    @property
    def num_futures(self) -> int:
        """M, always 1."""
        return 1


@SAMPLERS.register(GreedyConfig)
class GreedySampler(Sampler):
    """One future of T argmax tokens: the model's single most likely continuation."""

    config: GreedyConfig

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        return self.config.num_tokens

    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures of shape (1, T)."""
        t = self.config.num_tokens
        return check_futures(rollout.decode(token_rules.greedy, 1, t), 1, t)

    def sample_batch(self, batch: BatchRollout) -> list[Trajectories]:
        """Every row's future decoded together."""
        t = self.config.num_tokens
        return [check_futures(f, 1, t) for f in batch.decode([token_rules.greedy] * len(batch.rows), 1, t)]
