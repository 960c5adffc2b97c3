"""Lookahead sampler (LAQ): pseudo-queries decoded greedily from a cache a cheap method compressed.

"Lookahead Q-Cache: Achieving More Consistent KV Eviction via Pseudo Query",
https://arxiv.org/abs/2505.20334. Stage 1 compresses the prompt with SnapKV (the last
``draft_window`` prompt queries' attention, max-pooled, the window kept) to ``draft_budget``
candidates per KV head; T greedy pseudo tokens are then decoded from that draft cache
(positions preserved), the first one being the full prefill's next token as in the reference.
Their queries, after the last ``window`` prompt queries, form one pseudo-future that the
scorer reads against the ORIGINAL full prompt keys: the draft only shapes which queries the
model produces, not which keys they are scored on. The pseudo tokens' own keys are dropped
(R = 0), so their softmax covers the n prompt keys only, as in the reference.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from lorekv import token_rules
from lorekv.policies.uniform import UniformConfig, UniformPolicy
from lorekv.samplers.base import SAMPLERS, BatchRollout, Rollout, Sampler, SamplerConfig, check_futures
from lorekv.scorers.attention_mass import AttentionMassConfig, AttentionMassScorer
from lorekv.scores import Scores, Selection
from lorekv.trajectories import Trajectories, cat_optional


class LookaheadConfig(SamplerConfig):
    """Config of :class:`LookaheadSampler`.

    Attributes:
        draft_budget: candidates per KV head the stage-1 (SnapKV) draft cache keeps, counted as a
            policy's budget (>= 1; the re-fed last prompt token of query-aware mode on top).
        num_tokens: T, greedy pseudo tokens decoded from the draft cache (>= 1; LAQ's L = 8).
            Always T: the reference stops early when the next token is EOS, which would need
            a host synchronisation per step.
        window: w2, the last prompt queries scored with the pseudo-queries (>= 0; LAQ++ 8,
            plain LAQ 0).
        draft_window: SnapKV's observation window for the draft (>= 1; 32).
        draft_pool_kernel: SnapKV's max-pooling width for the draft (odd, >= 1; 7).
    """

    name: Literal["lookahead"] = "lookahead"
    draft_budget: int = Field(ge=1, strict=True)
    num_tokens: int = Field(default=8, ge=1, strict=True)
    window: int = Field(default=8, ge=0, strict=True)
    draft_window: int = Field(default=32, ge=1, strict=True)
    draft_pool_kernel: int = Field(default=7, ge=1, strict=True)

    @field_validator("draft_pool_kernel")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"draft_pool_kernel must be an odd integer >= 1, got {value!r}")
        return value

    @property
    def num_futures(self) -> int:
        """M, always 1 (greedy)."""
        return 1


@SAMPLERS.register(LookaheadConfig)
class LookaheadSampler(Sampler):
    """One pseudo-future (1, w2 + T): the last w2 prompt queries, then T draft-decoded pseudo-queries."""

    config: LookaheadConfig

    @property
    def prefill_window(self) -> int:
        """The larger of the draft's window and w2 (and 1 for ``include_last_prompt_query``)."""
        return max(self.config.draft_window, self.config.window, super().prefill_window)

    def draft(self, rollout: Rollout) -> Selection:
        """Stage 1: SnapKV's selection among the n prompt tokens (the re-fed last token included)."""
        cfg = self.config
        n, candidates = rollout.prompt_length, rollout.candidates
        window = rollout.prompt_window(cfg.draft_window)
        scores = AttentionMassScorer(AttentionMassConfig(pool_kernel=cfg.draft_pool_kernel)).score(window)[0]
        policy = UniformPolicy(UniformConfig(budget=cfg.draft_budget, recent=cfg.draft_window))
        chosen = policy.select(Scores(scores[..., :candidates], window.layer_indices, tail=n - candidates))
        tail = torch.arange(candidates, n, device=chosen.device)
        return Selection(
            indices=tuple(tuple(torch.cat([head, tail.to(head.device)]) for head in heads) for heads in chosen.indices),
            layer_indices=chosen.layer_indices,
            num_tokens=n,
        )

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        return self.config.num_tokens

    def sample(self, rollout: Rollout) -> Trajectories:
        """Pseudo-future (1, w2 + T) at positions [n-w2, ..., n-1, n, ..., n+T-1], no response keys."""
        t = self.config.num_tokens
        return self.merge(rollout, rollout.decode(token_rules.greedy, 1, t, keep=self.draft(rollout)))

    def sample_batch(self, batch: BatchRollout) -> list[Trajectories]:
        """Every row's draft-decoded future decoded together (each from its own draft cache)."""
        rows = batch.rows
        drafted = batch.decode(
            [token_rules.greedy] * len(rows), 1, self.config.num_tokens, keeps=[self.draft(row) for row in rows]
        )
        return [self.merge(row, futures) for row, futures in zip(rows, drafted, strict=True)]

    def merge(self, rollout: Rollout, futures: Trajectories) -> Trajectories:
        """Stage 2: the drafted future without its response keys, after the last w2 prompt queries."""
        cfg = self.config
        futures = check_futures(futures, 1, cfg.num_tokens)
        layers = tuple(
            replace(
                layer,
                response_keys=layer.response_keys[:, :, :0],
                response_values=layer.response_values[:, :, :0],
                lse=None,  # drafted from another cache, and scored without its own keys
            )
            for layer in futures.layers
        )
        if cfg.window == 0:
            return replace(futures, layers=layers)
        window = rollout.prompt_window(cfg.window)
        merged = tuple(
            replace(
                layer,
                queries=torch.cat([own.queries.to(layer.queries.dtype), layer.queries], dim=2),
                query_positions=torch.cat([own.query_positions.to(layer.query_positions), layer.query_positions]),
                query_norms=cat_optional([own.query_norms, layer.query_norms], dim=1),
                lse=cat_optional([own.lse, layer.lse], dim=2),
            )
            for own, layer in zip(window.layers, layers, strict=True)
        )
        return Trajectories(
            token_ids=torch.cat([window.token_ids.to(futures.token_ids), futures.token_ids], dim=1),
            logprobs=torch.cat([window.logprobs.to(futures.logprobs), futures.logprobs], dim=1),
            entropies=torch.cat([window.entropies.to(futures.entropies), futures.entropies], dim=1),
            layers=merged,
            prompt_length=futures.prompt_length,
        )
