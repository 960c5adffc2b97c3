"""Recency: a prompt token matters as much as it is recent (StreamingLLM's rule, as a score)."""

from __future__ import annotations

from typing import Literal

import torch

from lorekv.scorers.attention import compute_dtype
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.trajectories import LayerCapture


class RecencyConfig(ScorerConfig):
    name: Literal["recency"] = "recency"


@SCORERS.register(RecencyConfig)
class RecencyScorer(Scorer):
    """s_j(q) = (j + 1) / n, whatever the query: the top-B tokens are the B most recent.

    With protected sinks this is StreamingLLM ("Efficient Streaming Language Models with
    Attention Sinks", https://arxiv.org/abs/2309.17453): the first ``sink`` tokens and the
    most recent ones, nothing else. It reads no attention, so any sampler will do (the presets
    use the cheapest, a one-query prompt window).
    """

    config: RecencyConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) the same increasing ramp for every query."""
        n = layer.prompt_length
        ramp = torch.arange(1, n + 1, dtype=compute_dtype(layer), device=layer.prompt_keys.device) / max(n, 1)
        m, h, t, _ = layer.queries.shape
        return ramp.expand(m, h, t, n)
