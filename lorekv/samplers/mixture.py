"""Mixture sampler: the futures of several samplers, side by side, as one ensemble.

Different futures fail on different prompts (greedy and sampled futures on different task
families query-aware; sampled questions and a partial reconstruction of the context cover
different tokens query-agnostically), so an ensemble may hold several kinds. The mixture
draws every component's futures from the same prefilled prompt and hands them on together as a
:class:`~lorekv.trajectories.FutureMixture` of M = sum_i M_i futures, components in order.

Each component's futures keep their own shape (tokens, response keys, visibility): the scorer
scores each component's futures as they stand and concatenates the per-future scores, so
U_m for every m is exactly what that component alone would give; the aggregator then weighs
the M futures as it weighs any M (the mean: 1/M each, so a component's share is M_i / M; give a
component more futures to weigh it more). Token statistics reach the aggregator as each
future's mean over its own tokens (see :class:`~lorekv.trajectories.FutureMixture`). Mixing
kinds of futures is a modelling choice: the mean over them is a mixture estimate, not the Monte
Carlo estimate under the model's own sampling distribution.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import SerializeAsAny, field_validator

from lorekv.registry import ComponentConfig
from lorekv.samplers.base import SAMPLERS, BatchRollout, Rollout, Sampler, SamplerConfig
from lorekv.trajectories import FutureMixture


class MixtureConfig(SamplerConfig):
    """Config of :class:`MixtureSampler`.

    Attributes:
        samplers: the component samplers (at least two), each a sampler config, a mapping with
            a registry ``name`` or a bare name, e.g. ``[{"name": "questions"}, "greedy"]``.
            Their options (M, T, seeds) are their own.
    """

    name: Literal["mixture"] = "mixture"
    samplers: list[SerializeAsAny[ComponentConfig]]

    @field_validator("samplers", mode="before")
    @classmethod
    def _components(cls, value: Any) -> list[ComponentConfig]:
        if not isinstance(value, list | tuple) or len(value) < 2:
            raise ValueError(f"samplers must list at least two sampler configs, got {value!r}")
        return [SAMPLERS.parse(spec) for spec in value]


@SAMPLERS.register(MixtureConfig)
class MixtureSampler(Sampler):
    """Every component's futures, concatenated along M (a :class:`FutureMixture`)."""

    config: MixtureConfig

    def __init__(self, config: MixtureConfig) -> None:
        super().__init__(config)
        self.components: list[Sampler] = [SAMPLERS.build(spec) for spec in config.samplers]

    @property
    def prefill_window(self) -> int | Literal["all"]:
        """The widest window any component (or this config's own option) needs."""
        windows = [component.prefill_window for component in self.components] + [super().prefill_window]
        return "all" if "all" in windows else max(int(w) for w in windows)

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        """The most positions any component feeds (each starts at n)."""
        return max(component.future_positions(prompt_ids, tokenizer) for component in self.components)

    def sample(self, rollout: Rollout) -> FutureMixture:  # type: ignore[override]
        """Every component's futures (their own options applied), in order."""
        return FutureMixture(tuple(component.futures(rollout) for component in self.components))

    def sample_batch(self, batch: BatchRollout) -> list[FutureMixture]:  # type: ignore[override]
        """Every component's futures of every row (each component's own batching), per row."""
        per_component = [component.futures_batch(batch) for component in self.components]
        return [FutureMixture(tuple(parts)) for parts in zip(*per_component, strict=True)]
