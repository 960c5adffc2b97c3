"""Key norm (Knorm): a prompt token matters more the smaller its key's L2 norm."""

from __future__ import annotations

from typing import Literal

import torch

from lorekv.scorers.attention import compute_dtype
from lorekv.scorers.base import SCORERS, ScorerConfig
from lorekv.scorers.kv_head import KVHeadScorer
from lorekv.trajectories import LayerCapture


class KeyNormConfig(ScorerConfig):
    name: Literal["key_norm"] = "key_norm"


@SCORERS.register(KeyNormConfig)
class KeyNormScorer(KVHeadScorer):
    """s[g, j] = max_{g', i} ||k_{g', i}||_2 - ||k_{g, j}||_2, whatever the query.

    "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression",
    https://arxiv.org/abs/2406.11430: keys with a low L2 norm draw high attention, so the
    lowest-norm keys are kept. The reference (kvpress ``KnormPress``) scores -||k_j||_2; lorekv's
    scores are non-negative (the contract of :class:`~lorekv.scores.Scores`), so the score is
    -||k_j|| shifted by one constant per layer, the largest key norm over the layer's KV heads
    and prompt tokens. A shift changes no comparison: the ranking within a head and between the
    heads of a layer (what every policy compares) is that of -||k||; the largest-norm key
    scores 0. The keys are post-RoPE as cached; RoPE rotates pairs of coordinates and keeps the
    norm, so the pre-RoPE norm gives the same scores. Reads no attention: any sampler will do
    (the ``knorm`` preset uses the cheapest, a one-query prompt window).
    """

    config: KeyNormConfig

    def kv_head_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(G, n) the layer's largest key norm minus each key's norm, >= 0."""
        norms = torch.linalg.vector_norm(layer.prompt_keys.to(compute_dtype(layer)), dim=-1)
        if norms.numel() == 0:
            return norms
        return norms.max() - norms
