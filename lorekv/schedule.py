"""Compression while generating: a decoding schedule that keeps a cache within its budget.

A :class:`DecodingSchedule` is an eviction method (a :class:`~lorekv.pipeline.Pipeline`:
sampler, scorer, aggregator, ``uniform`` policy) and a ``buffer``. Attached to a cache, it
compresses each row, prompt and generated tokens alike, back to the policy's budget B per KV
head whenever the row holds B + ``buffer`` entries, with the method's own parts drawing on the
row's current state (:mod:`lorekv.hf.bounded`): a prompt-window sampler reads the queries of
the row's last w tokens, a sampled future continues the row from where it stands (its tokens
never enter the cache). The cache then never holds more than B + ``buffer`` entries per KV head
once it was first compressed, however long the output::

    schedule = DecodingSchedule(preset("lore_kv", 256), buffer=64)
    cache = schedule.cache(model)                       # a prompt kept as it is, then bounded
    model.generate(input_ids, cache=cache, max_new_tokens=4096)

    compressed = pipeline.compress(model, input_ids)   # or a compressed prompt, then bounded
    model.generate(input_ids, cache=schedule.attach(model, compressed), max_new_tokens=4096)

``Pipeline.generate(..., decoding=schedule)`` and the text pipeline's ``decoding=`` do the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from lorekv.hf import (
    CompressedCache,
    PositionedCache,
    check_fitted_for,
    check_supported,
    evictable_layers,
    prepare,
)
from lorekv.hf.bounded import Bound, check_method, held_counts
from lorekv.pipeline import Pipeline, PipelineConfig
from lorekv.presets import preset
from lorekv.validation import check_int_at_least

BUFFERS = {"rkv": 128, "knorm": 10}
"""Each preset's default ``buffer`` where its reference sets one: R-KV's 128; kvpress's
``DecodingPress`` compresses every 10 steps (its ``compression_steps``), with ``KnormPress`` as
its example scorer. Others: :data:`BUFFER`."""

BUFFER = 64
"""The default ``buffer``: a compression every 64 tokens."""

RECENT = {"lore_kv": 8, "lore_kv_fast": 8}
"""The protected window of a decoding preset whose prompt preset protects none: LORE-KV's futures
(and its fitted surrogate) read every held entry, but the newest tokens carry the text being
written; 8, R-KV's window."""

PER_HEAD = frozenset({"lore_kv_fast"})
"""Presets whose prompt policy shares the budget across heads (``global``) and that a schedule
runs with B per KV head (``uniform``), as it needs: LORE-KV's fitted surrogate, which records
each token's prediction as it is fed (KVzap's way of pruning while decoding)."""

ALIASES = {"decoding_press": "knorm"}
"""Schedule names for published decoding-time methods that are a preset with a buffer: kvpress's
``DecodingPress`` (https://github.com/NVIDIA/kvpress, ``presses/generation``) re-scores the
whole cache every ``compression_steps`` = 10 steps down to its target size, here with its
``KnormPress`` example."""

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class ScheduleConfig(BaseModel):
    """A decoding schedule, serialisable to YAML/JSON.

    Attributes:
        method: the eviction method that compresses (its policy ``uniform``; its budget B).
        buffer: entries per KV head a row takes above B before it is compressed again (>= 1,
            and at least the sampler's window): a compression every ``buffer`` tokens, a cache
            of at most B + ``buffer`` entries per KV head.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: PipelineConfig
    buffer: int = Field(default=BUFFER, strict=True, ge=1)


def schedule_preset(name: str, budget: int, *, buffer: int | None = None, **options: Any) -> ScheduleConfig:
    """The preset ``name`` (:func:`lorekv.presets.preset`, or an alias of :data:`ALIASES`) at
    budget B, compressing every ``buffer`` tokens (None: the reference's, :data:`BUFFERS`),
    with the protected window of :data:`RECENT` where the prompt preset has none, B per KV head
    where it shares B across heads (:data:`PER_HEAD`)."""
    name = ALIASES.get(name, name)
    if buffer is None:
        buffer = BUFFERS.get(name, BUFFER)
    method = preset(name, budget, **options)
    if name in PER_HEAD:
        method = method.override({"policy": {"name": "uniform", "budget": budget}})
    if name in RECENT:
        method = method.override({"policy.recent": RECENT[name]})
    return ScheduleConfig(method=method, buffer=buffer)


class DecodingSchedule:
    """A method and a buffer that keep a generating cache within B + ``buffer`` entries per KV head."""

    def __init__(
        self, method: Pipeline | PipelineConfig | Mapping[str, Any] | str | Path, *, buffer: int = BUFFER
    ) -> None:
        check_int_at_least("buffer", buffer, 1)
        self.pipeline = method if isinstance(method, Pipeline) else Pipeline.from_config(method)
        self.buffer = buffer
        check_method(self.pipeline, buffer)

    @classmethod
    def preset(cls, name: str, budget: int, *, buffer: int | None = None, **options: Any) -> DecodingSchedule:
        """:func:`schedule_preset` built: the preset ``name`` kept at budget B while generating."""
        return cls.from_config(schedule_preset(name, budget, buffer=buffer, **options))

    @classmethod
    def from_config(cls, config: ScheduleConfig | Mapping[str, Any]) -> DecodingSchedule:
        if not isinstance(config, ScheduleConfig):
            config = ScheduleConfig.model_validate(dict(config))
        return cls(config.method, buffer=config.buffer)

    @property
    def config(self) -> ScheduleConfig:
        return ScheduleConfig(method=self.pipeline.config, buffer=self.buffer)

    @property
    def budget(self) -> int:
        """B, the entries per KV head a row holds after each compression."""
        return int(self.pipeline.policy.config.budget)

    def check_model(self, model: PreTrainedModel) -> None:
        """Prepare ``model`` for lorekv's attention; refuse a fitted scorer's file of another model."""
        scorer = self.pipeline.scorer
        check_supported(model)
        if scorer.fitted_for is not None:
            check_fitted_for(scorer.fitted_for, model, f"the {scorer.config.name} scorer's file")
        prepare(model)

    def attach(self, model: PreTrainedModel, compressed: CompressedCache) -> CompressedCache:
        """A fork of ``compressed`` (a compressed prompt not yet continued) that this schedule
        keeps bounded while ``model.generate`` (or any model call) continues it; ``compressed``
        itself is left as it is.

        Raises:
            ValueError: the cache was already continued, or its heads hold different counts
                (a prompt compressed with a policy other than ``uniform``).
        """
        if not isinstance(compressed, CompressedCache):
            raise ValueError(f"compressed must be a CompressedCache, got {type(compressed).__name__}")
        if compressed.extended:
            raise ValueError(
                f"the compressed cache was already extended by {compressed.extended} tokens: attach a schedule to a "
                "fresh compression (or a fork taken before)"
            )
        if self.pipeline.scorer.state_maps:
            raise ValueError(
                f"the {self.pipeline.scorer.config.name} scorer reads what it recorded of every held token's hidden "
                "state, which a compressed prompt did not keep: bound the whole prompt with schedule.cache(model)"
            )
        self.check_model(model)
        out = compressed.fork()
        layers = evictable_layers(model)
        out.bound = Bound(model, self.pipeline, self.buffer, held_counts(out, layers, out.batch_size))
        return out

    def cache(self, model: PreTrainedModel, batch_size: int = 1) -> CompressedCache:
        """An empty cache for ``model.generate(input_ids, cache=...)`` (``batch_size`` rows,
        left-padded with their ``attention_mask`` as transformers generates): the prompt is
        prefilled whole, and compressed with the generation as soon as a row holds B +
        ``buffer`` entries (after the pass that fed it, so the first token comes from the whole
        prompt; compress the prompt first, :meth:`attach`, for the first token's rule)."""
        check_int_at_least("batch_size", batch_size, 1)
        self.check_model(model)
        device = next(model.parameters()).device
        empty = CompressedCache(
            PositionedCache.for_model(model.config), torch.zeros(batch_size, 0, dtype=torch.long, device=device), 0
        )
        empty.bound = Bound(model, self.pipeline, self.buffer, [0] * batch_size)
        return empty
