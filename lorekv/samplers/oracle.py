"""Oracle sampler: teacher-forces a known continuation, e.g. the true answer, as the future.

A diagnostic upper reference: how well would future-aware scoring do if it knew the answer?
It is also the KVzip-style building block (a future that repeats the context).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field, field_validator

from lorekv.samplers.base import SAMPLERS, Rollout, Sampler, SamplerConfig, check_futures
from lorekv.trajectories import Trajectories


class OracleConfig(SamplerConfig):
    """Config of :class:`OracleSampler`.

    Attributes:
        token_ids: M continuations of T token ids each: at least one, all of the same
            length T >= 1, ids >= 0 (the upper bound, the vocabulary size, is the rollout's to check).
    """

    name: Literal["oracle"] = "oracle"
    token_ids: list[list[Annotated[int, Field(ge=0, strict=True)]]]

    @field_validator("token_ids")
    @classmethod
    def _rectangular(cls, value: list[list[int]]) -> list[list[int]]:
        if not value:
            raise ValueError("token_ids needs at least one continuation")
        lengths = sorted({len(row) for row in value})
        if lengths[0] == 0:
            raise ValueError("token_ids continuations must hold at least one token")
        if len(lengths) > 1:
            raise ValueError(f"token_ids continuations must share one length, got lengths {lengths}")
        return value

    @property
    def num_futures(self) -> int:
        """M, the number of continuations."""
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        """T, the length of every continuation."""
        return len(self.token_ids[0])


@SAMPLERS.register(OracleConfig)
class OracleSampler(Sampler):
    """The configured continuations, fed after the prompt as (M, T) futures."""

    config: OracleConfig

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        return self.config.num_tokens

    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures of shape (M, T) holding exactly ``config.token_ids``."""
        ids = torch.tensor(self.config.token_ids, dtype=torch.long)
        m, t = ids.shape
        return check_futures(rollout.teacher_force(ids), m, t)
