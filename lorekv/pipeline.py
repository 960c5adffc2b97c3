"""An eviction method as a 4-tuple (sampler, scorer, aggregator, policy), run on a model.

``Pipeline.compress`` prefills the prompt once, lets the sampler draw futures from the
frozen model, scores every candidate prompt token with the scorer, combines the futures with
the aggregator, selects with the policy and returns a :class:`CompressedCache` holding only
the kept prompt entries: a transformers ``Cache`` that ``model.generate(input_ids,
cache=compressed)`` continues. ``Pipeline.generate`` compresses and decodes (through
``model.generate``).

A batch of prompts of different lengths is compressed at once, left-padded as transformers
generates (``compress(model, input_ids, attention_mask=mask)``): one prefill, every row's
futures drawn together, then each row scored and selected on its own, exactly as alone.

Two uses:
- query-aware (the default, LORE-KV's setting): the question is part of the prompt. The
  candidates are positions 0..n-2; the last prompt token is re-fed through the compressed
  cache, so the first answer token never comes from the full-cache prefill.
- query-agnostic: compress a context (every token a candidate), then feed one or more
  questions after it, uncompressed, each from a fork of the same compressed cache. A pipeline
  may name other parts for this mode (``agnostic_sampler``, ``agnostic_scorer``,
  ``agnostic_aggregator``, ``agnostic_policy``): futures that continue a context keep what a
  prompt window keeps, so LORE-KV's preset reconstructs the context there, scored as KVzip
  scores it (:func:`lorekv.presets.lore_kv`). The method is still a 4-tuple in each mode
  (:meth:`PipelineConfig.for_mode`).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

import lorekv.aggregators  # noqa: F401  (registration)
import lorekv.policies  # noqa: F401
import lorekv.samplers  # noqa: F401
import lorekv.scorers  # noqa: F401
from lorekv.aggregators.base import AGGREGATORS, Aggregator
from lorekv.aggregators.mean import MeanConfig
from lorekv.hf import (
    BatchRollout,
    CompressedCache,
    CompressionStats,
    Generation,
    ModelRollout,
    PhaseTimer,
    PositionedCache,
    check_batch,
    check_context,
    check_fitted_for,
    check_generate_options,
    check_supported,
    decode_batch,
    evictable_layers,
    gather,
    prepare,
)
from lorekv.policies.base import POLICIES, Policy
from lorekv.registry import ComponentConfig
from lorekv.samplers.base import SAMPLERS, Sampler
from lorekv.scorers.base import SCORERS, Scorer
from lorekv.scores import Scores, Selection
from lorekv.token_rules import TokenRule
from lorekv.trajectories import Trajectories
from lorekv.validation import check_int_at_least, describe

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

T = TypeVar("T")

FAMILIES = ("sampler", "scorer", "aggregator", "policy")
AGNOSTIC = {f"agnostic_{family}": family for family in FAMILIES}
"""Each optional query-agnostic part -> the family (and the part) it stands in for."""
PARTS = tuple(part for family in FAMILIES for part in (family, f"agnostic_{family}"))
"""The parts of a :class:`PipelineConfig`: the four families, each with its optional query-agnostic part."""
REGISTRIES = {"sampler": SAMPLERS, "scorer": SCORERS, "aggregator": AGGREGATORS, "policy": POLICIES}


def of_mode(part: T, agnostic: T | None, query_aware: bool) -> T:
    """The part (component or config) that serves a mode: its ``agnostic_`` counterpart for a
    context compressed before its question when there is one, ``part`` otherwise."""
    return part if query_aware or agnostic is None else agnostic


class PipelineConfig(BaseModel):
    """A whole method, serialisable to YAML/JSON; each part is a registry-named config.

    Attributes:
        sampler, scorer, aggregator, policy: the four parts (query-aware, and query-agnostic
            where no ``agnostic_`` part replaces them).
        agnostic_sampler, agnostic_scorer, agnostic_aggregator, agnostic_policy: the parts that
            replace them when a context is compressed before its question
            (``compress(..., query_aware=False)``); None (default): the same part in both modes.
            Left out of the YAML/JSON when None. A policy's budget is the method's, the same in
            both modes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampler: SerializeAsAny[ComponentConfig]
    agnostic_sampler: SerializeAsAny[ComponentConfig] | None = None
    scorer: SerializeAsAny[ComponentConfig]
    agnostic_scorer: SerializeAsAny[ComponentConfig] | None = None
    aggregator: SerializeAsAny[ComponentConfig] = Field(default_factory=MeanConfig)
    agnostic_aggregator: SerializeAsAny[ComponentConfig] | None = None
    policy: SerializeAsAny[ComponentConfig]
    agnostic_policy: SerializeAsAny[ComponentConfig] | None = None

    @field_validator(*PARTS, mode="before")
    @classmethod
    def _component(cls, value: Any, info: ValidationInfo) -> ComponentConfig | None:
        if value is None and info.field_name in AGNOSTIC:
            return None
        return REGISTRIES[AGNOSTIC.get(info.field_name, info.field_name)].parse(value)

    @model_validator(mode="after")
    def _one_budget(self) -> PipelineConfig:
        budget, agnostic = getattr(self.policy, "budget", None), getattr(self.agnostic_policy, "budget", None)
        if self.agnostic_policy is not None and agnostic != budget:
            raise ValueError(
                f"agnostic_policy.budget must equal policy.budget ({budget}), got {agnostic}: "
                "a method keeps one budget in both modes"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_unset_agnostic(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for part in AGNOSTIC:
                if data.get(part) is None:
                    data.pop(part, None)  # a pipeline without one reads and hashes as before it existed
        return data

    @property
    def agnostic_parts(self) -> tuple[str, ...]:
        """The ``agnostic_`` parts this pipeline sets."""
        return tuple(part for part in AGNOSTIC if getattr(self, part) is not None)

    def for_mode(self, query_aware: bool) -> PipelineConfig:
        """The 4-tuple that compresses in this mode: query-agnostic, each ``agnostic_`` part (when
        set) in place of its family's; no ``agnostic_`` part left in either."""
        update: dict[str, Any] = {part: None for part in AGNOSTIC}
        for part, family in AGNOSTIC.items():
            update[family] = of_mode(getattr(self, family), getattr(self, part), query_aware)
        return self.model_copy(update=update)

    @classmethod
    def from_file(cls, path: str | Path) -> PipelineConfig:
        """Read a ``.yaml``/``.yml`` or ``.json`` file; every error names the file."""
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"{path}: is a directory, expected a pipeline YAML/JSON file")
        if not path.exists():
            raise ValueError(f"{path}: no such pipeline config file")
        text = path.read_text()
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as error:
            raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a pipeline config must be a mapping with sampler, scorer, aggregator, policy")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as error:
            raise ValueError(f"{path}: {describe(error)}") from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def override(self, changes: Mapping[str, Any]) -> PipelineConfig:
        """A copy with fields replaced by dotted path, e.g. ``{"policy.budget": 64}``.

        Each path is ``<part>.<field>`` with part one of :data:`PARTS`; the result is validated
        like any config, so an unknown field or a bad value is an error naming it.
        ``"<part>.name"`` switches the part's component (its other fields must then exist on
        the new one); a bare ``"<part>"`` with a mapping or a component config replaces the
        whole part, e.g. ``{"sampler": {"name": "prompt_window", "window": 8}}``, and
        ``{"agnostic_sampler": None}`` removes a query-agnostic part (``sampler`` then serves
        both modes). A new component for a family (the whole part, or ``"<family>.name"``)
        serves both modes too, unless the same changes set its ``agnostic_`` part: a pipeline
        whose scorer was replaced scores with it. A new sampler, unless the same changes set an
        ``agnostic_`` part, removes them all: its futures, scored and selected as the pipeline's
        own, in both modes. A field of a part (``"sampler.num_futures"``) changes the
        query-aware part only (``"agnostic_sampler.<field>"`` the other), except
        ``"policy.budget"``, the method's budget, which sets both policies'.
        """
        data = self.model_dump()
        parts = {path.partition(".")[0] for path in changes}
        replaced = {path.partition(".")[0] for path in changes if path in FAMILIES or path.endswith(".name")}
        if "sampler" in replaced and not parts & set(AGNOSTIC):
            replaced |= set(FAMILIES)  # the new futures, scored as the pipeline scores, in both modes
        for part, family in AGNOSTIC.items():
            if family in replaced and part not in parts:
                data.pop(part, None)
        for path, value in changes.items():
            part, dot, field = path.partition(".")
            if part in PARTS and not dot:
                if value is None and part in AGNOSTIC:
                    data.pop(part, None)
                    continue
                if isinstance(value, ComponentConfig):
                    value = value.model_dump()
                if not isinstance(value, Mapping):
                    raise ValueError(
                        f"override {path!r}: replacing a whole part needs a mapping or a component config, "
                        f"got {value!r}"
                    )
                data[part] = dict(value)
                continue
            if part not in PARTS or not field or "." in field:
                raise ValueError(
                    f"override {path!r}: expected <part>.<field> or <part> with part one of {', '.join(PARTS)}"
                )
            if part not in data:
                raise ValueError(f"override {path!r}: this pipeline has no {part}; give the whole part as {part!r}")
            data[part][field] = value
            if path == "policy.budget" and "agnostic_policy" in data and "agnostic_policy.budget" not in changes:
                data["agnostic_policy"]["budget"] = value
        return PipelineConfig.model_validate(data)


def _component(registry: Any, kind: type[T], part: T | ComponentConfig | Mapping[str, Any] | str | None) -> Any:
    """A part given as a component, a config, a mapping or a registry name, as a component (None stays None)."""
    return part if part is None or isinstance(part, kind) else registry.build(part)


def check_stats_reach(sampler: Sampler | None, aggregator: str) -> None:
    """Refuse a ``mixture`` whose futures an aggregator weighs by their token statistics when one
    of its parts reports none (a reconstruction with ``token_stats`` off: log-prob 0, entropy 0,
    which would read as the most certain future). Alone, a reconstruction is one pseudo-future,
    whose weight is 1 whatever its statistics."""
    parts = getattr(sampler.config, "samplers", ()) if sampler is not None else ()
    silent = [part.name for part in parts if getattr(part, "token_stats", True) is False]
    if silent:
        raise ValueError(
            f"the {aggregator} aggregator weighs a mixture's futures by their token statistics, which its "
            f"{', '.join(silent)} part does not compute: set token_stats: true on it"
        )


def prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    samplers: Sequence[Sampler],
    *,
    attention_mask: torch.Tensor | None = None,
    lengths: Sequence[int] | None = None,
    query_aware: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
    compile: bool = False,
    query_norms: bool = False,
    state_maps: Mapping[str, Callable[[int, torch.Tensor], torch.Tensor]] | None = None,
) -> BatchRollout:
    """The prompts ``input_ids`` (b, N), left-padded, prefilled once for every sampler in ``samplers``.

    The prefill captures the widest query window any of them needs (every prompt query if one
    needs ``"all"``) and keeps the logits of the widest int window, so one prefill serves a
    pipeline alone and every method of an evaluation unit alike. Row i's candidates are its
    first n_i - 1 tokens query-aware (the last is re-fed through the compressed cache), all n_i
    otherwise. ``lengths`` (the real token counts, from :func:`check_batch`) spare a second read
    of ``attention_mask``. ``query_norms``: the captures record their queries' hidden-state norms
    (a scorer that reads them, KVzip+, needs it). ``state_maps``: what the prefill records of
    every prompt token's hidden state (the scorers' :attr:`~lorekv.scorers.base.Scorer.state_maps`,
    a fitted surrogate's predictions). Nothing is checked here: validate with
    :meth:`Pipeline.check_input` first.
    """
    windows = [sampler.prefill_window for sampler in samplers]
    ints = [w for w in windows if w != "all"]
    check_supported(model)
    prepare(model)
    if lengths is None:
        width = input_ids.shape[1]
        lengths = [width] * input_ids.shape[0] if attention_mask is None else attention_mask.sum(1).tolist()
    return BatchRollout(
        model,
        input_ids,
        lengths,
        evictable_layers(model),
        prefill_window="all" if "all" in windows else max(ints, default=0),
        tokenizer=tokenizer,
        pending=1 if query_aware else 0,
        stats_window=max(ints, default=0),
        compile=compile,
        query_norms=query_norms,
        state_maps=state_maps,
    )


class Pipeline:
    """sampler + scorer + aggregator + policy. Parts may be components, configs, mappings or names.

    The ``agnostic_`` parts (optional) replace their family's when a context is compressed
    before its question (``query_aware=False``): that mode runs :meth:`for_mode`'s pipeline.

    ``compile=True`` runs the scorer's kernel and the futures' attention through
    ``torch.compile`` (dynamic shapes; :mod:`lorekv.compiling`): the same scores up to float
    rounding, faster once compiled; the first compression pays the compilation. It is an
    execution choice, not part of :attr:`config`.
    """

    def __init__(
        self,
        sampler: Sampler | ComponentConfig | Mapping[str, Any] | str,
        scorer: Scorer | ComponentConfig | Mapping[str, Any] | str,
        aggregator: Aggregator | ComponentConfig | Mapping[str, Any] | str,
        policy: Policy | ComponentConfig | Mapping[str, Any],
        *,
        agnostic_sampler: Sampler | ComponentConfig | Mapping[str, Any] | str | None = None,
        agnostic_scorer: Scorer | ComponentConfig | Mapping[str, Any] | str | None = None,
        agnostic_aggregator: Aggregator | ComponentConfig | Mapping[str, Any] | str | None = None,
        agnostic_policy: Policy | ComponentConfig | Mapping[str, Any] | None = None,
        compile: bool = False,
    ) -> None:
        self.sampler: Sampler = _component(SAMPLERS, Sampler, sampler)
        self.scorer: Scorer = _component(SCORERS, Scorer, scorer)
        self.aggregator: Aggregator = _component(AGGREGATORS, Aggregator, aggregator)
        self.policy: Policy = _component(POLICIES, Policy, policy)
        self.agnostic_sampler: Sampler | None = _component(SAMPLERS, Sampler, agnostic_sampler)
        self.agnostic_scorer: Scorer | None = _component(SCORERS, Scorer, agnostic_scorer)
        self.agnostic_aggregator: Aggregator | None = _component(AGGREGATORS, Aggregator, agnostic_aggregator)
        self.agnostic_policy: Policy | None = _component(POLICIES, Policy, agnostic_policy)
        if self.agnostic_policy is not None:
            _ = self.config  # a PipelineConfig refuses two budgets
        self._agnostic: Pipeline | None = None
        if any(getattr(self, part) is not None for part in AGNOSTIC):
            parts = {
                family: of_mode(getattr(self, family), getattr(self, part), False) for part, family in AGNOSTIC.items()
            }
            self._agnostic = Pipeline(**parts, compile=compile)
        self.compile = compile
        if self.aggregator.uses_token_stats:
            check_stats_reach(self.sampler, self.aggregator.config.name)

    @property
    def compile(self) -> bool:
        """Whether the scorer's kernel and the futures' attention run ``torch.compile``'d."""
        return self._compile

    @compile.setter
    def compile(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"compile must be True or False, got {value!r}")
        self._compile = value
        self.scorer.compile = value
        if self._agnostic is not None:
            self._agnostic.compile = value

    @classmethod
    def from_config(cls, config: PipelineConfig | Mapping[str, Any] | str | Path, *, compile: bool = False) -> Pipeline:
        if isinstance(config, (str, Path)):
            config = PipelineConfig.from_file(config)
        elif not isinstance(config, PipelineConfig):
            config = PipelineConfig.model_validate(dict(config))
        parts = {part: getattr(config, part) for part in PARTS}
        return cls(**parts, compile=compile)

    @property
    def config(self) -> PipelineConfig:
        parts = {part: getattr(self, part) for part in PARTS}
        return PipelineConfig(**{part: None if c is None else c.config for part, c in parts.items()})

    def for_mode(self, query_aware: bool) -> Pipeline:
        """The pipeline that compresses in this mode: itself, or query-agnostic the one of its
        ``agnostic_`` parts (where set) and its other parts (the same components)."""
        return self if query_aware or self._agnostic is None else self._agnostic

    def sampler_for(self, query_aware: bool) -> Sampler:
        """The sampler that draws the futures in this mode (:meth:`for_mode`'s)."""
        return self.for_mode(query_aware).sampler

    def check_input(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        query_aware: bool,
        extra: int | Sequence[int] = 0,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> tuple[int, ...]:
        """Validate the prompts (a left-padded batch with ``attention_mask``), the policy's budget
        and the positions the futures and the ``extra`` question/answer tokens need (both start
        at each prompt's end; ``extra``: one count for every row, or one per row), before any
        model work; an error names the row. Returns each row's real token count."""
        mode = self.for_mode(query_aware)
        if mode.scorer.fitted_for is not None:
            check_fitted_for(mode.scorer.fitted_for, model, f"the {mode.scorer.config.name} scorer's file")
        minimum = 2 if query_aware else 1
        lengths = check_batch(model, input_ids, attention_mask, min_length=minimum)
        extras = [int(extra)] * len(lengths) if isinstance(extra, numbers.Integral) else list(extra)
        if len(extras) != len(lengths):
            raise ValueError(
                f"extra (answer_tokens) must give one count for every row or one per row ({len(lengths)}), "
                f"got {len(extras)}"
            )
        sampler = mode.sampler
        window = sampler.prefill_window
        tail = 1 if query_aware else 0
        width = input_ids.shape[1]
        for row, (n, fed) in enumerate(zip(lengths, extras, strict=True)):
            where = "" if len(lengths) == 1 else f"row {row}: "
            try:
                if window != "all" and window > n:
                    raise ValueError(f"window must be <= the prompt length {n}, got {window}")
                mode.policy.check_budget(n - tail, tail)
                future = sampler.future_positions(input_ids[row : row + 1, width - n :], tokenizer)
                check_context(model, n, future, f"{sampler.config.name} future")
                check_context(model, n, fed, "question/answer")
            except ValueError as error:
                raise ValueError(f"{where}{error}") from None
        return lengths

    @torch.no_grad()
    def compress(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        query_aware: bool = True,
        tokenizer: PreTrainedTokenizerBase | None = None,
        answer_tokens: int | Sequence[int] = 0,
    ) -> CompressedCache:
        """Prefill, sample futures, score, aggregate, select; return the compressed cache.

        ``input_ids`` (b, N) with ``attention_mask`` (b, N) is a left-padded batch: one prefill,
        every row's futures drawn together, then each row scored and selected on its own (its
        budget over its own candidates, padding never a candidate), giving the same kept set
        as compressing the row alone; the cache holds every row (ragged across rows and heads).
        ``query_aware=False`` compresses a context before its question, with the pipeline's
        ``agnostic_`` parts where it has them (:meth:`for_mode`).
        ``tokenizer`` is handed to the sampler through the rollout; only samplers that feed
        text of their own need it (``kvzip``'s repeat instruction, ``questions``' instruction),
        the others ignore it. ``answer_tokens``: positions the caller will feed after the
        prompt (question and answer; one count for every row, or one per row), checked with the
        futures against the model's context before any work.
        """
        lengths = self.check_input(
            model,
            input_ids,
            attention_mask=attention_mask,
            query_aware=query_aware,
            extra=answer_tokens,
            tokenizer=tokenizer,
        )
        mode = self.for_mode(query_aware)
        timer = PhaseTimer(input_ids.device)
        with timer.phase("prefill"):
            batch = prefill(
                model,
                input_ids,
                [mode.sampler],
                lengths=lengths,
                query_aware=query_aware,
                tokenizer=tokenizer,
                compile=self.compile,
                query_norms=mode.scorer.needs_query_norms,
                state_maps=mode.scorer.state_maps,
            )
        with timer.phase("sampling"):
            futures = mode.sampler.futures_batch(batch)
        with timer.phase("scoring"):
            scored = [mode.score(t, row.candidates) for t, row in zip(futures, batch.rows, strict=True)]
        compressed = mode.select_rows(batch.rows, scored, seconds=timer.seconds)
        compressed.method = self.config.for_mode(query_aware).model_dump(mode="json")
        return compressed

    def prefill(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        query_aware: bool = True,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> BatchRollout:
        """The first phase of :meth:`compress` (see :func:`prefill`); call :meth:`check_input`
        first, the phases check nothing themselves."""
        mode = self.for_mode(query_aware)
        return prefill(
            model,
            input_ids,
            [mode.sampler],
            attention_mask=attention_mask,
            query_aware=query_aware,
            tokenizer=tokenizer,
            compile=self.compile,
            query_norms=mode.scorer.needs_query_norms,
            state_maps=mode.scorer.state_maps,
        )

    def score(self, trajectories: Trajectories, candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, H, candidates) the aggregated scores of the first ``candidates`` prompt tokens, and
        (M,) the futures' weights: the scorer's per-future scores combined by the aggregator."""
        per_future = self.scorer.score(trajectories)[..., :candidates]
        return self.aggregator.aggregate(per_future, trajectories.logprobs, trajectories.entropies)

    def select(
        self,
        rollout: ModelRollout,
        scores: torch.Tensor,
        weights: torch.Tensor,
        *,
        seconds: dict[str, float] | None = None,
    ) -> CompressedCache:
        """The last phase of :meth:`compress` for one prompt: the policy's selection of ``scores``
        (L, H, c), gathered from the rollout's cache. ``seconds`` (the earlier phases' times) go
        into the stats."""
        return self.select_rows([rollout], [(scores, weights)], seconds=seconds)

    def select_rows(
        self,
        rows: Sequence[ModelRollout],
        scored: Sequence[tuple[torch.Tensor, torch.Tensor]],
        *,
        seconds: dict[str, float] | None = None,
    ) -> CompressedCache:
        """:meth:`select` for every row of a batch (:func:`select_rows` with this pipeline for each)."""
        return select_rows([self] * len(rows), rows, scored, seconds=seconds)

    def gather(self, rollout: ModelRollout, scores: torch.Tensor) -> tuple[PositionedCache, Selection]:
        """The policy's selection of one row's ``scores`` (L, H, c) and its cache of the kept entries."""
        n, candidates = rollout.prompt_length, rollout.candidates
        layers = tuple(sorted(rollout.evict_layers))
        selection = self.policy.select(Scores(scores, layers, tail=n - candidates))
        source = rollout.head_cache if candidates < n else rollout.cache  # every position < candidates
        return gather(source, selection), selection

    @staticmethod
    def stats(
        rollout: ModelRollout,
        cache: PositionedCache,
        selection: Selection,
        weights: torch.Tensor,
        *,
        seconds: dict[str, float],
    ) -> CompressionStats:
        n, candidates = rollout.prompt_length, rollout.candidates
        return CompressionStats(
            prompt_tokens=n,
            candidate_tokens=candidates,
            layer_indices=selection.layer_indices,
            kept=tuple(tuple(int(c) for c in row) for row in selection.counts().tolist()),
            bytes_before=rollout.cache.allocated_bytes(),
            bytes_after=cache.allocated_bytes(),
            bytes_kept=cache.kept_bytes(),
            pending_tokens=n - candidates,
            bytes_held=cache.held_bytes(n - candidates),
            seconds=dict(seconds),
            future_weights=tuple(weights.tolist()),
        )

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
        tokenizer: PreTrainedTokenizerBase | None = None,
        decoding: Any = None,
        **generate_kwargs: Any,
    ) -> Generation:
        """Compress ``input_ids`` (1, n) and decode an answer with ``model.generate`` (:func:`decode`).

        Without ``question_ids`` the prompt is compressed query-aware; with them the prompt
        is a context compressed query-agnostically and the question is fed after it.
        ``tokenizer`` is passed to :meth:`compress` (samplers that feed text need it).
        Greedy unless ``rule`` or ``generate_kwargs`` (any ``model.generate`` option:
        ``do_sample=True``, ``temperature``, a ``streamer``, ...) say otherwise. ``decoding``: a
        :class:`lorekv.schedule.DecodingSchedule` that keeps the cache within its budget while
        the answer is generated. A batch goes through :meth:`generate_batch`.
        """
        if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] != 1:
            raise ValueError(f"input_ids has {input_ids.shape[0]} rows: answer a batch with generate_batch")
        return self.generate_batch(
            model,
            input_ids,
            max_new_tokens,
            question_ids=question_ids,
            eos_token_id=eos_token_id,
            rule=rule,
            tokenizer=tokenizer,
            decoding=decoding,
            **generate_kwargs,
        )[0]

    @torch.no_grad()
    def generate_batch(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        max_new_tokens: int = 32,
        *,
        attention_mask: torch.Tensor | None = None,
        question_ids: torch.Tensor | None = None,
        question_mask: torch.Tensor | None = None,
        eos_token_id: int | list[int] | None = None,
        rule: TokenRule | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        decoding: Any = None,
        **generate_kwargs: Any,
    ) -> list[Generation]:
        """:meth:`generate` for a left-padded batch ``input_ids`` (b, N) with ``attention_mask``:
        one compression of every row, one ``model.generate`` call answering every row
        (:func:`decode_batch`); each row's answer ends at its own first ``eos_token_id``.
        ``question_ids`` (b, q), left-padded with ``question_mask``, hold one question per row
        (query-agnostic); to ask rows different numbers of questions, compress once and decode
        each round from ``compressed.rows(indices)``."""
        check_int_at_least("max_new_tokens", max_new_tokens, 1)
        check_generate_options(model, generate_kwargs)
        answer_tokens: int | list[int] = max_new_tokens
        if question_ids is not None:
            questions = check_batch(model, question_ids, question_mask, "question_ids")
            rows = input_ids.shape[0] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 else None
            if rows is not None and len(questions) != rows:
                raise ValueError(f"question_ids has {len(questions)} rows; input_ids has {rows} (one question per row)")
            answer_tokens = [max_new_tokens + q for q in questions]  # each row's own question
        compressed = self.compress(
            model,
            input_ids,
            attention_mask=attention_mask,
            query_aware=question_ids is None,
            tokenizer=tokenizer,
            answer_tokens=answer_tokens,
        )
        return decode_batch(
            model,
            compressed,
            question_ids,
            question_mask,
            max_new_tokens,
            eos_token_id=eos_token_id,
            rule=rule,
            decoding=decoding,
            **generate_kwargs,
        )


def select_rows(
    pipelines: Sequence[Pipeline],
    rows: Sequence[ModelRollout],
    scored: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    seconds: dict[str, float] | None = None,
) -> CompressedCache:
    """The last phase of compression for every row of a batch: row i's scores and future weights
    ``scored[i]`` selected by ``pipelines[i]`` (the evaluation grid's ratio budgets and oracle
    futures differ from row to row) and gathered from its cache exactly as alone, then every
    row's cache stacked into one padded cache. ``seconds`` (the earlier phases' times, of the
    whole batch) go into every row's stats."""
    timer = PhaseTimer(scored[0][0].device, seconds)
    caches, selections, parts = [], [], []
    with timer.phase("selection"):
        for pipeline, rollout, (scores, weights) in zip(pipelines, rows, scored, strict=True):
            cache, selection = pipeline.gather(rollout, scores)
            caches.append(cache), selections.append(selection), parts.append((rollout, cache, selection, weights))
        stacked = PositionedCache.stack(caches)
    stats = [Pipeline.stats(*part, seconds=timer.seconds) for part in parts]
    batch = rows[0].batch
    start = batch.input_ids.shape[1] - batch.pending
    return CompressedCache(stacked, batch.input_ids, start, selections, stats, attention_mask=batch.attention_mask)
