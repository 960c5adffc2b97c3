"""Nucleus (top-p) sampler: temperature sampling restricted to the likely head of the vocabulary."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from lorekv import token_rules
from lorekv.samplers.base import SAMPLERS
from lorekv.samplers.temperature import TemperatureConfig, TemperatureSampler
from lorekv.token_rules import TokenRule


class NucleusConfig(TemperatureConfig):
    """Config of :class:`NucleusSampler`: :class:`TemperatureConfig` plus ``top_p``.

    Attributes:
        top_p: nucleus mass in (0, 1]. Each token is drawn from the smallest set of most
            likely tokens holding at least this probability, renormalised; 1 is plain
            temperature sampling (same draws for the same seed). Cutting the tail trades
            the unbiasedness of the Monte Carlo mean for futures that avoid rare tokens.
    """

    name: Literal["nucleus"] = "nucleus"  # type: ignore[assignment]
    top_p: float = Field(default=0.9, gt=0.0, le=1.0, allow_inf_nan=False)


@SAMPLERS.register(NucleusConfig)
class NucleusSampler(TemperatureSampler):
    """M futures of T tokens, each drawn by top-p sampling at the configured temperature."""

    config: NucleusConfig

    def rule(self, generator: torch.Generator) -> TokenRule:
        cfg = self.config
        return lambda logits: token_rules.nucleus(logits, cfg.temperature, cfg.top_p, generator, cfg.draws)
