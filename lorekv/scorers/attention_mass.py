"""Attention mass: a prompt token matters as much as the attention weight it receives."""

from __future__ import annotations

from typing import Literal

import torch

from lorekv.scorers.attention import prompt_attention_weights
from lorekv.scorers.base import SCORERS, Scorer, ScorerConfig
from lorekv.trajectories import LayerCapture


class AttentionMassConfig(ScorerConfig):
    name: Literal["attention_mass"] = "attention_mass"


@SCORERS.register(AttentionMassConfig)
class AttentionMassScorer(Scorer):
    """s_j(q) = a_j, the softmax weight of prompt token j for query q.

    The weights are normalised over every key the query sees, prompt and response alike, so
    over the prompt tokens they sum to at most 1 (exactly 1 for a query that sees no
    response key, e.g. the prompt-window control). Keys the query cannot see score 0.
    With a prompt-window sampler and ``pool_kernel`` > 1 this is SnapKV; with a window of
    one query and ``kv_heads="shared"`` it is TOVA; with a greedy future it is a lookahead score.
    """

    config: AttentionMassConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) attention weights on the prompt keys (:func:`prompt_attention_weights`)."""
        return prompt_attention_weights(layer)
