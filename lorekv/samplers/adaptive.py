"""Adaptive sampler: a few futures first, and more only where they disagree.

Issue 22's adaptive M: the estimate's spread across sampler seeds sits on the prompts where the
model is unsure of the answer's surface form, while on the others every future is the same and
further futures add nothing. The sampler draws M_0 futures at temperature; when they are all
identical it stops, otherwise it draws M_max - M_0 more from the same generator and hands on all
M_max. Identical futures have identical per-future scores (a future's queries are a function of
its tokens), so the rule stops exactly when the first round's per-future scores have zero
sample variance, and spends the futures where the Monte Carlo estimate is noisy.

The estimate is the mean over the drawn futures (with the ``mean`` aggregator). Under the
stopping rule it is consistent but not unbiased: the first round's futures count fully when
they agree and M_0 / M_max when they do not, a bias of (1 - M_0/M_max) P(D) (mu - E[first
round's mean | D]) with D the event that they disagree; the temperature-1 mean of a fixed M is
the paper's unbiased estimate.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lorekv.samplers.base import SAMPLERS, BatchRollout, Rollout, check_futures
from lorekv.samplers.temperature import TemperatureConfig, TemperatureSampler
from lorekv.token_rules import TokenRule
from lorekv.trajectories import Trajectories, concat_futures


class AdaptiveConfig(TemperatureConfig):
    """Config of :class:`AdaptiveSampler`: :class:`TemperatureConfig` (temperature, T, seed,
    draws) with a first round and a most.

    Attributes:
        num_futures: M_0, the futures of the first round (>= 1; default 2).
        max_futures: M_max (>= num_futures; default 8), the futures when the first round's are
            not all identical. M_max = M_0 always stops after the first round (the
            ``temperature`` sampler with M = M_0).
    """

    name: Literal["adaptive"] = "adaptive"  # type: ignore[assignment]
    num_futures: int = Field(default=2, ge=1, strict=True)
    max_futures: int = Field(default=8, ge=1, strict=True)

    @model_validator(mode="after")
    def _rounds(self) -> AdaptiveConfig:
        if self.max_futures < self.num_futures:
            raise ValueError(
                f"max_futures must be >= num_futures={self.num_futures} (the first round), got {self.max_futures}"
            )
        return self


def agree(futures: Trajectories) -> bool:
    """Whether every future holds the same tokens as the first."""
    return bool((futures.token_ids == futures.token_ids[:1]).all())


@SAMPLERS.register(AdaptiveConfig)
class AdaptiveSampler(TemperatureSampler):
    """M_0 futures of T tokens, or M_max when the first M_0 are not all identical."""

    config: AdaptiveConfig

    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures of shape (M_0, T) or (M_max, T)."""
        cfg = self.config
        rule = self.rule(rollout.generator(cfg.seed))
        first = self._round(rollout.decode(rule, cfg.num_futures, cfg.num_tokens), cfg.num_futures)
        if agree(first) or cfg.max_futures == cfg.num_futures:
            return first
        return self._more(first, rollout.decode(rule, cfg.max_futures - cfg.num_futures, cfg.num_tokens))

    def sample_batch(self, batch: BatchRollout) -> list[Trajectories]:
        """Every row's rounds drawn together; a row whose first futures agree draws the second
        round with the others but discards it, so its futures do not depend on the batch."""
        cfg = self.config
        rules: list[TokenRule] = [self.rule(row.generator(cfg.seed)) for row in batch.rows]
        first = [self._round(f, cfg.num_futures) for f in batch.decode(rules, cfg.num_futures, cfg.num_tokens)]
        unsure = [not agree(f) for f in first]
        if not any(unsure) or cfg.max_futures == cfg.num_futures:
            return first
        more = batch.decode(rules, cfg.max_futures - cfg.num_futures, cfg.num_tokens)
        return [self._more(f, g) if u else f for f, g, u in zip(first, more, unsure, strict=True)]

    def _round(self, futures: Trajectories, num_futures: int) -> Trajectories:
        return check_futures(futures, num_futures, self.config.num_tokens)

    def _more(self, first: Trajectories, second: Trajectories) -> Trajectories:
        cfg = self.config
        return concat_futures([first, self._round(second, cfg.max_futures - cfg.num_futures)])
