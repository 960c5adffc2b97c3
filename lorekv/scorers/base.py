"""Scorer interface: how much does one prompt token matter to one query?

A scorer maps each layer's captured attention to per-query token scores s_j(q) of shape
(M, H, T, n), then reduces them over the T queries of a future (mean or max) and over the
query heads of each GQA group (mean or max), giving U_m[l, g, j] of shape (M, L, G, n).
An optional 1-D max pooling over neighbouring prompt tokens (SnapKV's clustering) follows;
it runs over the prefix that precedes the first query, so that a prompt window's own tokens
(positions at or after its first query, protected by the SnapKV-style presets) never lend
their scores to the tokens before them.

Memory: :meth:`Scorer.score` converts a layer to the compute dtype once (a float32 copy of a
bf16 layer's keys and values, one layer at a time), forms what the scorer needs of the prompt
alone once (:meth:`Scorer.prompt_terms`), and hands its queries to
:meth:`Scorer.query_scores` in chunks of futures and queries holding at most
:func:`chunk_elements` (query, query head, key) elements (:data:`SCORE_CHUNK`, or one layer's
prompt keys and values when they hold more), combining the per-chunk reductions exactly (sums
then one division by T for ``mean``, a running maximum for ``max``; the futures are
independent). Every scorer's per-query tensors (logits, weights, distances, scores) are then
bounded whatever M and T are (at least one query's row, H * (n+R)): the memory of scoring does
not grow with the futures or their tokens, which is what makes scoring with all n prompt
queries (H2O), a whole reconstructed context (KVzip) or many futures at 32K tokens affordable;
and LORE-KV's few dozen queries score a layer in one pass, its kernel launches per layer the
same at any n.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from einops import reduce
from pydantic import field_validator

from lorekv.compiling import compiled
from lorekv.registry import ComponentConfig, Registry
from lorekv.scorers.attention import compute_dtype
from lorekv.trajectories import FutureMixture, LayerCapture, Trajectories
from lorekv.validation import check_int_at_least

Reduction = Literal["mean", "max"]

SCORE_CHUNK = 2**22
"""Most (query, query head, key) elements :meth:`Scorer.score` gives :meth:`Scorer.query_scores`
at once, or the layer's own prompt keys and values if they hold more (:func:`chunk_elements`):
16 MiB per float32 per-query tensor at least (not a config field: the result does not depend on
it beyond float rounding of the ``mean``'s sum). A chunk holds at least one query."""


def chunk_elements(prompt_keys: torch.Tensor) -> int:
    """The most (query, query head, key) elements one chunk of a layer's queries may hold:
    :data:`SCORE_CHUNK`, or the elements of the layer's prompt keys and values (2 G n d, twice
    ``prompt_keys`` (G, n, d)) when larger.

    A per-query tensor as large as one layer's prompt KV is small beside the cache the prefill
    holds (L layers of it) and grows with n as the cache does; with it a few dozen futures'
    queries (LORE-KV's M (T + 1)) of a GQA model score a whole layer in one pass at any n (one
    set of kernel launches per layer, not one per chunk), while H2O's n prompt queries and
    KVzip's reconstruction are still chunked, their memory linear in n."""
    return max(SCORE_CHUNK, 2 * prompt_keys.numel())


class ScorerConfig(ComponentConfig):
    """Base config of every scorer.

    Attributes:
        query_reduction: how the T queries of one future are combined.
        head_reduction: how the query heads of one KV group are combined.
        pool_kernel: odd width (>= 1) of a 1-D max pooling over neighbouring prompt tokens
            applied after the reductions (SnapKV's clustering), over the tokens before the
            first query only; 1 disables it.
        kv_heads: ``"separate"`` scores each KV head from its own query heads;
            ``"shared"`` gives every KV head of a layer the mean over all of them (all the
            layer's query heads, as TOVA does), so every head keeps the same tokens.
    """

    query_reduction: Reduction = "mean"
    head_reduction: Reduction = "mean"
    pool_kernel: int = 1
    kv_heads: Literal["separate", "shared"] = "separate"

    @field_validator("pool_kernel")
    @classmethod
    def _pool_kernel(cls, value: int) -> int:
        check_int_at_least("pool_kernel", value, 1)
        if value % 2 == 0:
            raise ValueError(f"pool_kernel must be an odd integer >= 1 (1, 3, 5, ...), got {value!r}")
        return value


class Scorer(ABC):
    """Per-query token scores, reduced to one score per (future, layer, KV head, token).

    Subclasses implement :meth:`query_scores`; :meth:`score` applies the reductions named in
    the config and is shared by every scorer.

    Attributes:
        compile: run :meth:`query_scores` through ``torch.compile`` (dynamic shapes, see
            :mod:`lorekv.compiling`); an execution choice, not part of the config, since the
            scores are the same. Off by default.
    """

    config: ScorerConfig
    needs_query_norms: ClassVar[bool] = False
    """The scorer reads :attr:`~lorekv.trajectories.LayerCapture.query_norms`: a pipeline with it
    asks its rollout to record them."""

    def __init__(self, config: ScorerConfig, *, compile: bool = False) -> None:
        self.config = config
        self.compile = compile

    @property
    def state_maps(self) -> dict[str, Callable[[int, torch.Tensor], torch.Tensor]]:
        """What the prefill must record of every prompt token's hidden state for this scorer:
        name -> f(layer index, (B, q, D) states) -> (B, q, F), read back as
        :attr:`~lorekv.trajectories.LayerCapture.prompt_features` (a fitted surrogate's
        predictions); none by default."""
        return {}

    @property
    def fitted_for(self) -> str | None:
        """The fingerprint of the only model this scorer may score (a fitted surrogate's), checked
        by the pipeline before any work; None: any model."""
        return None

    def _query_scores(self, layer: LayerCapture, terms: Any = None) -> torch.Tensor:
        """:meth:`query_scores`, compiled when :attr:`compile` is set; ``terms`` (the layer's
        :meth:`prompt_terms`) is passed on when there are any."""
        args = (layer,) if terms is None else (layer, terms)
        if self.compile:
            return compiled(type(self).query_scores)(self, *args)
        return self.query_scores(*args)

    def prompt_terms(self, layer: LayerCapture) -> Any:
        """What :meth:`query_scores` needs of ``layer`` that does not depend on its queries
        (None: nothing).

        :meth:`score_layer` forms it once per layer and passes it to every chunk's
        :meth:`query_scores` as a second argument: per-token terms over the whole prompt
        (centred values, Gram norms) then cost one pass per layer instead of one per chunk.
        A scorer that returns something here accepts it in :meth:`query_scores`.
        """
        return None

    @abstractmethod
    def query_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) score of every prompt token for every query of every future, in the
        capture's dtype promoted to at least float32."""

    def score(self, trajectories: Trajectories | FutureMixture) -> torch.Tensor:
        """(M, L, G, n) per-future token scores U_m[l, g, j], at least float32.

        A :class:`~lorekv.trajectories.FutureMixture` (the ``mixture`` sampler's futures) is
        scored part by part, each part as it stands, the parts' futures concatenated along M.

        Per layer: :meth:`query_scores` (M, H, T, n), computed on chunks of at most
        :data:`SCORE_CHUNK` elements -> reduce over the T queries (``query_reduction``; ``mean`` divides
        the sum by T, so a query that cannot see token j counts as 0 for it) -> (M, H, n) ->
        reduce over the ``group`` query heads of each KV head (``head_reduction``) -> (M, G, n)
        -> shared across KV heads (``kv_heads``) -> max pooling over the tokens before the first
        query (``pool_kernel``). The layers are stacked in the order of ``trajectories.layers``;
        with no layers the result has shape (M, 0, 0, n).
        """
        if isinstance(trajectories, FutureMixture):
            return torch.cat([self.score(part) for part in trajectories.parts])
        per_layer = [self.score_layer(layer) for layer in trajectories.layers]
        if not per_layer:
            return torch.zeros(trajectories.num_futures, 0, 0, trajectories.prompt_length)
        return torch.stack(per_layer, dim=1)

    def score_layer(self, layer: LayerCapture) -> torch.Tensor:
        """(M, G, n) the reduced scores of one layer, its futures and queries scored in chunks
        of at most :func:`chunk_elements` elements (see the module docstring)."""
        layer = layer.to(compute_dtype(layer))
        terms = self.prompt_terms(layer)
        m, h, t, _ = layer.queries.shape
        rows = max(1, chunk_elements(layer.prompt_keys) // (h * max(layer.num_keys, 1)))
        if m * t <= rows:
            return self.reduce(self._query_scores(layer, terms), layer)
        mean = self.config.query_reduction == "mean"
        futures, queries = max(1, rows // t), min(t, rows)
        parts = []
        for first in range(0, m, futures):
            block = layer.future_slice(first, min(first + futures, m))
            total: torch.Tensor | None = None
            for start in range(0, t, queries):
                scores = self._query_scores(block.query_slice(start, min(start + queries, t)), terms)
                part = scores.sum(dim=2) if mean else scores.amax(dim=2)
                if total is None:
                    total = part
                else:
                    total = total + part if mean else torch.maximum(total, part)
            parts.append(total)
        total = torch.cat(parts)
        return self.reduce_heads(total / t if mean else total, layer)

    def reduce(self, query_scores: torch.Tensor, layer: LayerCapture) -> torch.Tensor:
        """(M, H, T, n) per-query scores of ``layer`` -> (M, G, n) per-KV-head scores, at least float32.

        ``query_reduction`` over the T queries (``mean`` as the sum divided by T, as
        :meth:`score_layer` combines chunks), then :meth:`reduce_heads`.
        """
        scores = query_scores.to(torch.promote_types(query_scores.dtype, torch.float32))
        if self.config.query_reduction == "mean":
            per_head = scores.sum(dim=2) / scores.shape[2]
        else:
            per_head = reduce(scores, "m h t n -> m h n", "max")
        return self.reduce_heads(per_head, layer)

    def reduce_heads(self, per_head: torch.Tensor, layer: LayerCapture) -> torch.Tensor:
        """(M, H, n) per-query-head scores -> (M, G, n): head reduction, ``kv_heads``, pooling.

        Query head h belongs to KV head g = h // group, so the heads of group g are the
        contiguous block ``g*group .. (g+1)*group - 1``.
        """
        cfg = self.config
        per_kv_head = reduce(per_head, "m (g r) n -> m g n", cfg.head_reduction, g=layer.num_kv_heads)
        if cfg.kv_heads == "shared":
            per_kv_head = per_kv_head.mean(dim=1, keepdim=True).expand_as(per_kv_head).contiguous()
        if cfg.pool_kernel == 1 or layer.query_positions.numel() == 0:
            return per_kv_head
        # the tokens before the first query, as a mask on the device (no host synchronisation)
        before = torch.arange(per_kv_head.shape[-1], device=per_kv_head.device) < layer.query_positions.min()
        pooled = max_pool_tokens(per_kv_head.masked_fill(~before, float("-inf")), cfg.pool_kernel)
        return torch.where(before, pooled, per_kv_head)


def max_pool_tokens(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """Max over a centred window of ``kernel`` (odd) neighbouring tokens, stride 1.

    Args:
        scores: (..., n) scores along the token axis.
        kernel: odd window width; 1 returns ``scores`` unchanged.

    Returns:
        (..., n): entry j is the max of ``scores[..., j-k//2 : j+k//2+1]`` clipped to [0, n).
    """
    if kernel == 1:
        return scores
    flat = scores.reshape(-1, 1, scores.shape[-1])
    pooled = F.max_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2)
    return pooled.reshape(scores.shape)


SCORERS: Registry[Scorer] = Registry("scorer")
