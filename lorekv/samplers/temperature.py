"""Temperature sampler: M independent futures drawn from the model (LORE-KV's default)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from lorekv import token_rules
from lorekv.samplers.base import SAMPLERS, BatchRollout, Rollout, Sampler, SamplerConfig, check_futures
from lorekv.token_rules import Draws, TokenRule
from lorekv.trajectories import Trajectories


class TemperatureConfig(SamplerConfig):
    """Config of :class:`TemperatureSampler`; defaults are the paper's (M=4, T=8, temperature 1).

    Attributes:
        num_futures: M, independent futures (>= 1).
        num_tokens: T, tokens per future (>= 1).
        temperature: softmax temperature (finite, > 0). At 1 the futures follow the model's
            own distribution and the mean aggregator is a plain Monte Carlo estimate.
        seed: seeds the rollout's generator afresh on every :meth:`TemperatureSampler.sample`
            call, so the same prompt and config give the same futures.
        draws: ``independent`` (the paper's) or ``stratified``: at each step the M futures'
            tokens come from M uniforms one per stratum [j/M, (j+1)/M) of the likelihood-ranked
            distribution (Latin hypercube sampling over the steps,
            :func:`~lorekv.token_rules.stratified_uniforms`). Each future is still an exact draw,
            so the mean stays unbiased; the futures spread over the first token's distribution
            instead of repeating its mode, a variance reduction across seeds.
    """

    name: Literal["temperature"] = "temperature"
    num_futures: int = Field(default=4, ge=1, strict=True)
    num_tokens: int = Field(default=8, ge=1, strict=True)
    temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    seed: int = Field(default=0, strict=True)
    draws: Draws = "independent"


@SAMPLERS.register(TemperatureConfig)
class TemperatureSampler(Sampler):
    """M futures of T tokens, each token drawn from softmax(logits / temperature)."""

    config: TemperatureConfig

    def rule(self, generator: torch.Generator) -> TokenRule:
        """The token rule, drawing from ``generator``."""
        cfg = self.config
        return lambda logits: token_rules.temperature(logits, cfg.temperature, generator, cfg.draws)

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        return self.config.num_tokens

    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures of shape (M, T)."""
        cfg = self.config
        futures = rollout.decode(self.rule(rollout.generator(cfg.seed)), cfg.num_futures, cfg.num_tokens)
        return check_futures(futures, cfg.num_futures, cfg.num_tokens)

    def sample_batch(self, batch: BatchRollout) -> list[Trajectories]:
        """Every row's futures drawn together, each row from its own generator seeded with
        ``seed``: a row's futures do not depend on the batch it is in."""
        cfg = self.config
        rules = [self.rule(row.generator(cfg.seed)) for row in batch.rows]
        futures = batch.decode(rules, cfg.num_futures, cfg.num_tokens)
        return [check_futures(f, cfg.num_futures, cfg.num_tokens) for f in futures]
