"""Scorer interface: how much does one prompt token matter to one query?

A scorer maps each layer's captured attention to per-query token scores s_j(q) of shape
(M, H, T, n), then reduces them over the T queries of a future (mean or max) and over the
query heads of each GQA group (mean or max), giving U_m[l, g, j] of shape (M, L, G, n).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch

from lorekv.registry import ComponentConfig, Registry
from lorekv.trajectories import LayerCapture, Trajectories

Reduction = Literal["mean", "max"]


class ScorerConfig(ComponentConfig):
    """Base config of every scorer.

    Attributes:
        query_reduction: how the T queries of one future are combined.
        head_reduction: how the query heads of one KV group are combined.
        pool_kernel: odd width of a 1-D max pooling over neighbouring prompt tokens applied
            after the reductions (SnapKV's clustering); 1 disables it.
    """

    query_reduction: Reduction = "mean"
    head_reduction: Reduction = "mean"
    pool_kernel: int = 1


class Scorer(ABC):
    config: ScorerConfig

    def __init__(self, config: ScorerConfig) -> None:
        self.config = config

    @abstractmethod
    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) score of every prompt token for every query of every future."""

    def score(self, trajectories: Trajectories) -> torch.Tensor:
        """(M, L, G, n) per-future token scores, reduced over queries and group heads."""
        raise NotImplementedError


SCORERS: Registry[Scorer] = Registry("scorer")
