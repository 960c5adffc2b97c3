"""Expected Attention: the attention a Gaussian model of the future queries expects each key to get.

"Expected Attention: KV Cache Compression by Estimating Attention from Future Queries
Distribution", https://arxiv.org/abs/2510.00636 (kvpress's ``ExpectedAttentionPress``).
"""

from __future__ import annotations

from typing import Literal

import torch
from einops import einsum, rearrange
from pydantic import Field

from lorekv.scorers.attention import compute_dtype
from lorekv.scorers.base import SCORERS, ScorerConfig
from lorekv.scorers.kv_head import KVHeadScorer
from lorekv.trajectories import LayerCapture


class ExpectedAttentionConfig(ScorerConfig):
    """Config of :class:`ExpectedAttentionScorer` (kvpress's defaults).

    Attributes:
        horizon: the future positions n .. n + horizon - 1 whose rotations are averaged (>= 1).
        sink: leading prompt tokens left out of the query statistics and of the softmax, and
            scored the layer's largest score instead (>= 0; attention sinks).
        covariance: add the queries' covariance term (False: the mean query alone).
        value_norm: multiply by ||v_j|| (False: the expected attention alone).
        epsilon: added to the expected attention before the value norm multiplies it (>= 0).
    """

    name: Literal["expected_attention"] = "expected_attention"
    horizon: int = Field(default=512, ge=1, strict=True)
    sink: int = Field(default=4, ge=0, strict=True)
    covariance: bool = True
    value_norm: bool = True
    epsilon: float = Field(default=0.0, ge=0.0)


@SCORERS.register(ExpectedAttentionConfig)
class ExpectedAttentionScorer(KVHeadScorer):
    """s[g, j] = (mean over g's query heads h of softmax_j(z_hj) + epsilon) * ||v_j||, with

        z_hj = s μ'_h . k_j + (s² / 2) k_jᵀ Σ'_h k_j,   j >= sink,

    the log of E[exp(s q . k_j)] for a query q ~ N(μ'_h, Σ'_h) of head h (s: the layer's softmax
    scale, 1/√d), i.e. the attention the key can expect from the future's queries. μ and Σ are
    the mean and (population) covariance of the captured queries before their rotary position
    embedding, over every query at a position >= ``sink`` (the prompt's with the
    ``prompt_window("all")`` sampler, as the paper; any future's queries otherwise, pooled over
    the futures); the future rotation is the mean of the RoPE rotations R_p over the next
    ``horizon`` positions p = n, n+1, ...: μ' = R̄ μ, Σ' = R̄ Σ R̄ᵀ. Sink tokens score the
    layer's largest score, so a top-k keeps them (a prompt of ``sink`` tokens or fewer scores 1
    everywhere). Every future gets the same scores (one Gaussian for all of them).

    As kvpress's ``ExpectedAttentionPress``, except: the statistics come from the model's own
    queries (un-rotated with its rotary tables, :attr:`LayerCapture.rotary`) rather than from
    ``W_q`` times the layer's input, so a query bias or norm (Qwen's, Gemma 3's ``q_norm``) is
    included (for Llama they are the same queries); the scale is the layer's own (Gemma 3's
    ``query_pre_attn_scalar``), not 1/√d; float32 at least.
    """

    config: ExpectedAttentionConfig

    def kv_head_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(G, n) the expected attention of each prompt token times its value's norm, >= 0."""
        cfg = self.config
        if layer.rotary is None:
            raise ValueError(
                "the expected_attention scorer needs the model's rotary tables (LayerCapture.rotary), which "
                "lorekv's rollout records; a capture built without them cannot be scored"
            )
        dtype = compute_dtype(layer)
        n, sink = layer.prompt_length, min(cfg.sink, layer.prompt_length)
        if n == sink:  # every token a sink: nothing to rank, all kept first
            return torch.ones(layer.num_kv_heads, n, dtype=dtype, device=layer.prompt_keys.device)
        mean, cov = query_statistics(layer, cfg.sink, dtype)  # (H, d), (H, d, d)
        rotation = future_rotation(layer, n, cfg.horizon, dtype)  # (d, d)
        mean = mean @ rotation.T
        keys = layer.prompt_keys.to(dtype)[:, sink:]  # (G, n - sink, d)
        grouped_mean = rearrange(mean, "(g r) d -> g r d", g=layer.num_kv_heads)
        logits = einsum(grouped_mean, keys, "g r d, g j d -> g r j") * layer.scaling
        if cfg.covariance:
            cov = rotation @ cov @ rotation.T
            grouped_cov = rearrange(cov, "(g r) d e -> g r d e", g=layer.num_kv_heads)
            spread = einsum(keys, grouped_cov, keys, "g j d, g r d e, g j e -> g r j")
            logits = logits + spread * (layer.scaling**2 / 2)
        scores = torch.softmax(logits, dim=-1).mean(dim=1) + cfg.epsilon  # (G, n - sink)
        if cfg.value_norm:
            scores = scores * torch.linalg.vector_norm(layer.prompt_values.to(dtype)[:, sink:], dim=-1)
        return torch.cat([scores.max().expand(layer.num_kv_heads, sink), scores], dim=1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(-x2, x1) for x = (x1, x2) split in halves along the last axis: RoPE's quarter turn."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def query_statistics(layer: LayerCapture, sink: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, d) mean and (H, d, d) population covariance of the layer's queries before RoPE, over
    every future and every query at a position >= ``sink``.

    RoPE stores q' = c q + s J q (c, s the tables at the query's position, J the quarter turn);
    c² + s² is the same on both halves, so q = (c q' - s J q') / (c² + s²) exactly (a rotation,
    scaled where the model scales its tables)."""
    keep = layer.query_positions >= sink
    positions = layer.query_positions[keep]
    if positions.numel() == 0:
        raise ValueError(f"expected_attention: no query at a position >= sink={sink} to take statistics from")
    queries = layer.queries[:, :, keep].to(dtype)  # (M, H, T', d)
    cos, sin = (table.to(dtype) for table in layer.rotary(positions))  # (T', d)
    if cos.shape[-1] != queries.shape[-1]:
        raise ValueError(
            f"expected_attention: the model rotates {cos.shape[-1]} of each head's {queries.shape[-1]} dimensions "
            "(partial rotary embedding), which its future rotation does not model"
        )
    plain = (queries * cos - rotate_half(queries) * sin) / (cos**2 + sin**2)
    samples = rearrange(plain, "m h t d -> h (m t) d")
    mean = samples.mean(dim=1)
    centred = samples - mean[:, None]
    return mean, centred.transpose(1, 2) @ centred / samples.shape[1]


def future_rotation(layer: LayerCapture, start: int, horizon: int, dtype: torch.dtype) -> torch.Tensor:
    """(d, d) R̄ = the mean over p = start .. start + horizon - 1 of RoPE's R_p = diag(c_p) + diag(s_p) J."""
    positions = torch.arange(start, start + horizon, device=layer.query_positions.device)
    cos, sin = (table.to(dtype).mean(dim=0) for table in layer.rotary(positions))  # (d,)
    d = cos.shape[0]
    turn = rotate_half(torch.eye(d, dtype=dtype, device=cos.device)).T  # J as a matrix: J @ x = rotate_half(x)
    return torch.diag(cos) + torch.diag(sin) @ turn
