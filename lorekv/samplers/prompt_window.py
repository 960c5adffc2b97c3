"""Prompt-window sampler: the control that stands the prompt's own last queries in for the future.

This is the observation window of SnapKV (w of about 32) and TOVA (w = 1): no tokens are
generated; the scorer sees the queries of the last w prompt tokens as captured in prefill.
``window="all"`` takes every prompt query (H2O's accumulated attention).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from lorekv.samplers.base import SAMPLERS, Rollout, Sampler, SamplerConfig
from lorekv.trajectories import Trajectories


class PromptWindowConfig(SamplerConfig):
    """Config of :class:`PromptWindowSampler`.

    Attributes:
        window: w, how many trailing prompt queries stand for the future (>= 1), or
            ``"all"``: every prompt query (w = n). The prefill then captures (1, H, n, d)
            queries per layer and keeps no logits for them, so the window's token log-probs
            and entropies are reported as 0 (one pseudo-future: no aggregator weight depends
            on them); the scorer processes the n queries in chunks (``QUERY_CHUNK``).
    """

    name: Literal["prompt_window"] = "prompt_window"
    window: Annotated[int, Field(ge=1, strict=True)] | Literal["all"] = 32


@SAMPLERS.register(PromptWindowConfig)
class PromptWindowSampler(Sampler):
    """One pseudo-future: the last w prompt tokens' queries (no response keys, R = 0)."""

    config: PromptWindowConfig

    @property
    def prefill_window(self) -> int | Literal["all"]:
        """w: the prefill must capture the queries of the last w prompt tokens (or all of them)."""
        return self.config.window

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        return 0  # the prompt's own queries: nothing is fed

    def sample(self, rollout: Rollout) -> Trajectories:
        """One pseudo-future of shape (1, w): the window's prompt tokens and their prefill queries (w = n for "all")."""
        return rollout.prompt_window(self.config.window)
