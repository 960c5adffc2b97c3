"""Prompt-window sampler: the control that stands the prompt's own last queries in for the future.

This is the observation window of SnapKV (w of about 32) and TOVA (w = 1): no tokens are
generated; the scorer sees the queries of the last w prompt tokens as captured in prefill.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lorekv.samplers.base import SAMPLERS, Rollout, Sampler, SamplerConfig
from lorekv.trajectories import Trajectories


class PromptWindowConfig(SamplerConfig):
    """Config of :class:`PromptWindowSampler`.

    Attributes:
        window: w, how many trailing prompt queries stand for the future (>= 1).
    """

    name: Literal["prompt_window"] = "prompt_window"
    window: int = Field(default=32, ge=1, strict=True)


@SAMPLERS.register(PromptWindowConfig)
class PromptWindowSampler(Sampler):
    """One pseudo-future: the last w prompt tokens' queries (no response keys, R = 0)."""

    config: PromptWindowConfig

    @property
    def prefill_window(self) -> int:
        """w: the prefill must capture the queries of the last w prompt tokens."""
        return self.config.window

    def sample(self, rollout: Rollout) -> Trajectories:
        """One pseudo-future of shape (1, w): the window's prompt tokens and their prefill queries."""
        return rollout.prompt_window(self.config.window)
