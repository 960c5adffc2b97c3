"""R-KV: the attention a recent window gives a token, less how redundant its key is."""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from einops import rearrange, reduce
from pydantic import Field

from lorekv.scorers.attention import compute_dtype
from lorekv.scorers.base import SCORE_CHUNK, SCORERS, Scorer, ScorerConfig, max_pool_tokens
from lorekv.trajectories import LayerCapture


class RedundancyConfig(ScorerConfig):
    """Config of :class:`RedundancyScorer`.

    Attributes:
        mix_lambda: λ, the weight of the attention part (R-KV's 0.07), in [0, 1].
        similarity_threshold: keys whose cosine similarity with a token's key exceeds it are
            that token's near-copies (R-KV's 0.5), in [-1, 1].
        pool_kernel: R-KV pools the attention part over 7 neighbouring tokens.
    """

    name: Literal["rkv"] = "rkv"
    mix_lambda: Annotated[float, Field(ge=0.0, le=1.0)] = 0.07
    similarity_threshold: Annotated[float, Field(ge=-1.0, le=1.0)] = 0.5
    pool_kernel: int = 7


@SCORERS.register(RedundancyConfig)
class RedundancyScorer(Scorer):
    """s_j = λ · a_j − (1 − λ) · r_j + (1 − λ), per KV head (R-KV, "R-KV: Redundancy-aware KV
    Cache Compression for Reasoning Models", https://arxiv.org/abs/2505.24133).

    Importance a_j: each window query's logits q·k_j·scale, maxed over the query heads of the KV
    head's group, softmaxed over the tokens *before the window* (the candidates), averaged over
    the window's queries and max-pooled over ``pool_kernel`` neighbours (among those tokens).
    Redundancy r_j: with the keys normalised (k / (‖k‖ + 1e-8)) and S their cosine similarities
    over every held key (diagonal 0), row i forgets its newest near-copy (S[i, J_i] = 0 for
    J_i the largest j with S[i, j] > threshold; 0 when none, as the reference code does),
    and r = softmax_j(mean_i S[i, j]). A token that many others resemble is redundant: its
    information survives in them. The shift 1 − λ (r ≤ 1) makes the scores non-negative, as
    :class:`~lorekv.scores.Scores` requires; it changes no ranking.

    The paper's reference (``rkv/compression/r1_kv.py``) runs at decoding time with a window
    of 8 recent queries, λ = 0.07 and a budget that counts the window: the ``rkv`` preset, with
    :class:`lorekv.schedule.DecodingSchedule` (``buffer=128`` as the reference). The window's
    own tokens score as the rest but are protected by the preset's policy (``recent``).
    """

    config: RedundancyConfig

    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        raise NotImplementedError("the rkv scorer scores per KV head: call score_layer")

    def score_layer(self, layer: LayerCapture) -> torch.Tensor:
        """(M, G, n) the R-KV scores of every held token."""
        cfg = self.config
        layer = layer.to(compute_dtype(layer))
        n = layer.prompt_length
        before = torch.arange(n, device=layer.prompt_keys.device) < layer.query_positions.min()
        queries = rearrange(layer.queries, "m (g r) t d -> m g r t d", g=layer.num_kv_heads)
        logits = torch.einsum("mgrtd,gnd->mgrtn", queries, layer.prompt_keys) * layer.scaling
        logits = reduce(logits, "m g r t n -> m g t n", "max").masked_fill(~before, float("-inf"))
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0).mean(dim=2)  # (M, G, n)
        pooled = max_pool_tokens(weights.masked_fill(~before, float("-inf")), cfg.pool_kernel)
        importance = torch.where(before, pooled, weights)
        redundancy = key_redundancy(layer.prompt_keys, cfg.similarity_threshold)
        lam = cfg.mix_lambda
        return lam * importance - (1 - lam) * redundancy.unsqueeze(0) + (1 - lam)


def key_redundancy(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """(G, n) R-KV's redundancy of each key among keys (G, n, d): softmax over j of the mean
    cosine similarity S[i, j] over i, each row's newest near-copy (and the diagonal) zeroed.

    The rows i are formed in chunks of at most :data:`~lorekv.scorers.base.SCORE_CHUNK` similarities,
    so the memory is linear in n (a whole prompt's keys, compressed by a decoding schedule)."""
    g, n, _ = keys.shape
    unit = keys / (torch.linalg.vector_norm(keys, dim=-1, keepdim=True) + 1e-8)
    columns = keys.new_zeros(g, n)
    rows = max(1, SCORE_CHUNK // max(g * n, 1))
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        similarity = unit[:, start:stop] @ unit.transpose(-1, -2)  # (G, r, n)
        own = torch.arange(stop - start, device=keys.device)
        similarity[:, own, own + start] = 0.0
        near = similarity > threshold
        newest = (n - 1) - near.flip(-1).to(torch.uint8).argmax(dim=-1)  # the largest j with S[i, j] > threshold
        newest = torch.where(near.any(dim=-1), newest, torch.zeros_like(newest))
        columns += similarity.scatter(-1, newest.unsqueeze(-1), 0.0).sum(dim=1)
    return torch.softmax(columns / n, dim=-1)
