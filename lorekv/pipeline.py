"""An eviction method as a 4-tuple (sampler, scorer, aggregator, policy), run on a model.

``Pipeline.compress`` prefills the prompt once, lets the sampler draw futures from the
frozen model, scores every candidate prompt token with the scorer, combines the futures with
the aggregator, selects with the policy and returns a :class:`CompressedCache` holding only
the kept prompt entries. ``Pipeline.generate`` compresses and decodes.

Two uses:
- query-aware (the default, LORE-KV's setting): the question is part of the prompt. The
  candidates are positions 0..n-2; the last prompt token is re-fed through the compressed
  cache, so the first answer token never comes from the full-cache prefill.
- query-agnostic: compress a context (every token a candidate), then feed one or more
  questions after it, uncompressed, each from a fork of the same compressed cache.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from pydantic import BaseModel, ConfigDict, SerializeAsAny, ValidationInfo, field_validator
from transformers import PreTrainedModel

import lorekv.aggregators  # noqa: F401  (registration)
import lorekv.policies  # noqa: F401
import lorekv.samplers  # noqa: F401
import lorekv.scorers  # noqa: F401
from lorekv.aggregators.base import AGGREGATORS, Aggregator
from lorekv.attention import prepare
from lorekv.compressed import CompressedCache, CompressionStats
from lorekv.decoding import Generation, decode
from lorekv.kv_cache import PADDING, PositionedCache
from lorekv.policies.base import POLICIES, Policy
from lorekv.registry import ComponentConfig
from lorekv.rollout import ModelRollout
from lorekv.samplers.base import SAMPLERS, Sampler, TokenRule
from lorekv.scorers.base import SCORERS, Scorer
from lorekv.scores import Scores, Selection
from lorekv.validation import check_int_at_least


class PipelineConfig(BaseModel):
    """A whole method, serialisable to YAML/JSON; each part is a registry-named config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampler: SerializeAsAny[ComponentConfig]
    scorer: SerializeAsAny[ComponentConfig]
    aggregator: SerializeAsAny[ComponentConfig] = {"name": "mean"}  # type: ignore[assignment]
    policy: SerializeAsAny[ComponentConfig]

    @field_validator("sampler", "scorer", "aggregator", "policy", mode="before")
    @classmethod
    def _component(cls, value: Any, info: ValidationInfo) -> ComponentConfig:
        registry = {"sampler": SAMPLERS, "scorer": SCORERS, "aggregator": AGGREGATORS, "policy": POLICIES}
        return registry[info.field_name].parse(value)

    @classmethod
    def from_file(cls, path: str | Path) -> PipelineConfig:
        """Read a ``.yaml``/``.yml`` or ``.json`` file."""
        text = Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a pipeline config must be a mapping with sampler, scorer, aggregator, policy")
        return cls.model_validate(dict(data))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def evictable_layers(model: PreTrainedModel) -> list[int]:
    """Full-attention layers; sliding-window layers bound their own cache and are left alone."""
    text = model.config.get_text_config()
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    return [i for i, t in enumerate(types) if t == "full_attention"]


def attention_modules(model: PreTrainedModel) -> dict[int, torch.nn.Module]:
    """Layer index -> attention module (the modules holding ``layer_idx`` and a ``scaling``)."""
    return {
        module.layer_idx: module
        for module in model.modules()
        if hasattr(module, "layer_idx") and hasattr(module, "scaling")
    }


def check_supported(model: PreTrainedModel) -> None:
    """Fail early, before any model work, for models lorekv cannot hook into."""
    name = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{name} does not use transformers' attention interface; lorekv needs it to capture queries")
    text = model.config.get_text_config()
    if getattr(text, "attn_logit_softcapping", None):
        raise ValueError(f"{name} uses attention logit soft-capping, which lorekv does not support")
    layers = evictable_layers(model)
    if not layers:
        raise ValueError(f"{name} has no full-attention layer to evict from")
    modules = attention_modules(model)
    for idx in layers:
        projection = getattr(modules.get(idx), "o_proj", None)
        if not isinstance(projection, torch.nn.Linear):
            raise ValueError(
                f"{name}: layer {idx} has no attention module with an `o_proj` linear layer; "
                "lorekv needs each head's output projection W_o^h"
            )


def _max_positions(model: PreTrainedModel) -> int | None:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


class Pipeline:
    """sampler + scorer + aggregator + policy. Parts may be components, configs, mappings or names."""

    def __init__(
        self,
        sampler: Sampler | ComponentConfig | Mapping[str, Any] | str,
        scorer: Scorer | ComponentConfig | Mapping[str, Any] | str,
        aggregator: Aggregator | ComponentConfig | Mapping[str, Any] | str = "mean",
        policy: Policy | ComponentConfig | Mapping[str, Any] | str | None = None,
    ) -> None:
        if policy is None:
            raise ValueError("policy is required (it carries the budget), e.g. {'name': 'uniform', 'budget': 64}")
        self.sampler: Sampler = sampler if isinstance(sampler, Sampler) else SAMPLERS.build(sampler)
        self.scorer: Scorer = scorer if isinstance(scorer, Scorer) else SCORERS.build(scorer)
        self.aggregator: Aggregator = (
            aggregator if isinstance(aggregator, Aggregator) else AGGREGATORS.build(aggregator)
        )
        self.policy: Policy = policy if isinstance(policy, Policy) else POLICIES.build(policy)

    @classmethod
    def from_config(cls, config: PipelineConfig | Mapping[str, Any] | str | Path) -> Pipeline:
        if isinstance(config, (str, Path)):
            config = PipelineConfig.from_file(config)
        elif not isinstance(config, PipelineConfig):
            config = PipelineConfig.model_validate(dict(config))
        return cls(config.sampler, config.scorer, config.aggregator, config.policy)

    @property
    def config(self) -> PipelineConfig:
        return PipelineConfig(
            sampler=self.sampler.config,
            scorer=self.scorer.config,
            aggregator=self.aggregator.config,
            policy=self.policy.config,
        )

    def _future_tokens(self) -> int:
        return int(getattr(self.sampler.config, "num_tokens", 0) or 0)

    def check_input(
        self, model: PreTrainedModel, input_ids: torch.Tensor, *, query_aware: bool, extra: int = 0
    ) -> None:
        """Validate a prompt before any model work."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids must be a (1, n) tensor of token ids")
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"input_ids must have batch size 1 (batched prompts are not supported), got {input_ids.shape[0]}"
            )
        n = input_ids.shape[1]
        minimum = 2 if query_aware else 1
        if n < minimum:
            raise ValueError(
                f"input_ids must hold at least {minimum} token(s) "
                f"({'query-aware mode re-feeds the last one' if query_aware else 'empty prompt'}), got {n}"
            )
        window = self.sampler.prefill_window
        if window > n:
            raise ValueError(f"window must be <= the prompt length {n}, got {window}")
        limit = _max_positions(model)
        need = n + self._future_tokens() + extra
        if limit is not None and need > limit:
            raise ValueError(
                f"prompt of {n} tokens plus {need - n} future/answer tokens exceeds the model's context of {limit}"
            )

    @torch.no_grad()
    def compress(self, model: PreTrainedModel, input_ids: torch.Tensor, *, query_aware: bool = True) -> CompressedCache:
        """Prefill, sample futures, score, aggregate, select; return the compressed cache."""
        self.check_input(model, input_ids, query_aware=query_aware)
        check_supported(model)
        prepare(model)
        layers = evictable_layers(model)
        seconds: dict[str, float] = {}

        start = time.perf_counter()
        rollout = ModelRollout(model, input_ids, layers, prefill_window=self.sampler.prefill_window)
        seconds["prefill"] = time.perf_counter() - start

        start = time.perf_counter()
        trajectories = self.sampler.sample(rollout)
        seconds["sampling"] = time.perf_counter() - start

        n = input_ids.shape[1]
        candidates = n - 1 if query_aware else n
        start = time.perf_counter()
        per_future = self.scorer.score(trajectories)[..., :candidates]
        combined, _ = self.aggregator.aggregate(per_future, trajectories.logprobs, trajectories.entropies)
        seconds["scoring"] = time.perf_counter() - start

        start = time.perf_counter()
        selection = self.policy.select(Scores(combined, tuple(layers)))
        source = rollout.head_cache if query_aware else rollout.cache
        cache = gather(source, selection, limit=candidates)
        seconds["selection"] = time.perf_counter() - start

        stats = CompressionStats(
            prompt_tokens=n,
            candidate_tokens=candidates,
            layer_indices=tuple(layers),
            kept=tuple(tuple(int(c) for c in row) for row in selection.counts().tolist()),
            bytes_before=rollout.cache.allocated_bytes(),
            bytes_after=cache.allocated_bytes(),
            bytes_kept=cache.kept_bytes(),
            seconds=seconds,
        )
        pending = input_ids[:, n - 1 :] if query_aware else input_ids[:, :0]
        return CompressedCache(cache, candidates, pending, selection, stats)

    @torch.no_grad()
    def generate(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        max_new_tokens: int = 32,
        *,
        question_ids: torch.Tensor | None = None,
        eos_token_id: int | list[int] | None = None,
        rule: TokenRule | None = None,
    ) -> Generation:
        """Compress ``input_ids`` and decode an answer (greedy unless ``rule`` says otherwise).

        Without ``question_ids`` the prompt is compressed query-aware; with them the prompt
        is a context compressed query-agnostically and the question is fed after it.
        """
        check_int_at_least("max_new_tokens", max_new_tokens, 1)
        extra = max_new_tokens + (0 if question_ids is None else question_ids.shape[-1])
        self.check_input(model, input_ids, query_aware=question_ids is None, extra=extra)
        compressed = self.compress(model, input_ids, query_aware=question_ids is None)
        return decode(model, compressed, question_ids, max_new_tokens, eos_token_id=eos_token_id, rule=rule)


def gather(source: PositionedCache, selection: Selection, *, limit: int) -> PositionedCache:
    """A new cache with the selected entries of evicted layers and positions < ``limit`` elsewhere.

    Heads of one layer that keep different counts are padded to the longest (position -1,
    masked by the lorekv attention function).
    """
    out = PositionedCache([layer.window for layer in source.layers])
    row = {layer_idx: i for i, layer_idx in enumerate(selection.layer_indices)}
    for idx, (src, dst) in enumerate(zip(source.layers, out.layers, strict=True)):
        if idx in row:
            kept, valid = selection.padded(row[idx])
            kept = kept.to(src.keys.device)
            valid = valid.to(src.keys.device)
            index = kept.view(1, *kept.shape, 1).expand(1, -1, -1, src.keys.shape[-1])
            positions = torch.where(valid, src.positions[0].gather(1, kept), torch.full_like(kept, PADDING))
            dst.set(
                src.keys.gather(2, index),
                src.values.gather(2, index),
                positions.unsqueeze(0),
                padded=not bool(valid.all()),
            )
        else:
            keep = src.positions[0, 0] < limit
            dst.set(src.keys[:, :, keep], src.values[:, :, keep], src.positions[:, :, keep], padded=src.padded)
    return out
