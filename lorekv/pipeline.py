"""An eviction method as a 4-tuple (sampler, scorer, aggregator, policy), run on a model.

``Pipeline.compress`` prefills the prompt once, lets the sampler draw futures from the
frozen model, scores every candidate prompt token with the scorer, combines the futures with
the aggregator, selects with the policy and returns a :class:`CompressedCache` holding only
the kept prompt entries: a transformers ``Cache`` that ``model.generate(input_ids,
past_key_values=compressed)`` continues. ``Pipeline.generate`` compresses and decodes (through
``model.generate``).

Two uses:
- query-aware (the default, LORE-KV's setting): the question is part of the prompt. The
  candidates are positions 0..n-2; the last prompt token is re-fed through the compressed
  cache, so the first answer token never comes from the full-cache prefill.
- query-agnostic: compress a context (every token a candidate), then feed one or more
  questions after it, uncompressed, each from a fork of the same compressed cache.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, ValidationInfo, field_validator

import lorekv.aggregators  # noqa: F401  (registration)
import lorekv.policies  # noqa: F401
import lorekv.samplers  # noqa: F401
import lorekv.scorers  # noqa: F401
from lorekv.aggregators.base import AGGREGATORS, Aggregator
from lorekv.aggregators.mean import MeanConfig
from lorekv.hf import (
    CompressedCache,
    CompressionStats,
    Generation,
    ModelRollout,
    PhaseTimer,
    check_context,
    check_generate_options,
    check_supported,
    check_token_ids,
    decode,
    evictable_layers,
    gather,
    prepare,
)
from lorekv.policies.base import POLICIES, Policy
from lorekv.registry import ComponentConfig
from lorekv.samplers.base import SAMPLERS, Sampler
from lorekv.scorers.base import SCORERS, Scorer
from lorekv.scores import Scores
from lorekv.token_rules import TokenRule
from lorekv.trajectories import Trajectories
from lorekv.validation import check_int_at_least, describe

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FAMILIES = ("sampler", "scorer", "aggregator", "policy")


class PipelineConfig(BaseModel):
    """A whole method, serialisable to YAML/JSON; each part is a registry-named config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampler: SerializeAsAny[ComponentConfig]
    scorer: SerializeAsAny[ComponentConfig]
    aggregator: SerializeAsAny[ComponentConfig] = Field(default_factory=MeanConfig)
    policy: SerializeAsAny[ComponentConfig]

    @field_validator("sampler", "scorer", "aggregator", "policy", mode="before")
    @classmethod
    def _component(cls, value: Any, info: ValidationInfo) -> ComponentConfig:
        registry = {"sampler": SAMPLERS, "scorer": SCORERS, "aggregator": AGGREGATORS, "policy": POLICIES}
        return registry[info.field_name].parse(value)

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

        Each path is ``<part>.<field>`` with part one of sampler, scorer, aggregator, policy;
        the result is validated like any config, so an unknown field or a bad value is an
        error naming it. ``"<part>.name"`` switches the part's component (its other fields
        must then exist on the new one); a bare ``"<part>"`` with a mapping replaces the whole
        part, e.g. ``{"sampler": {"name": "prompt_window", "window": 8}}``.
        """
        data = self.model_dump()
        for path, value in changes.items():
            part, dot, field = path.partition(".")
            if part in FAMILIES and not dot:
                if not isinstance(value, Mapping):
                    raise ValueError(f"override {path!r}: replacing a whole part needs a mapping, got {value!r}")
                data[part] = dict(value)
                continue
            if part not in FAMILIES or not field or "." in field:
                raise ValueError(
                    f"override {path!r}: expected <part>.<field> or <part> with part one of {', '.join(FAMILIES)}"
                )
            data[part][field] = value
        return PipelineConfig.model_validate(data)


def prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    samplers: Sequence[Sampler],
    *,
    query_aware: bool = True,
    tokenizer: PreTrainedTokenizerBase | None = None,
    compile: bool = False,
) -> ModelRollout:
    """The prompt ``input_ids`` (1, n) prefilled once for every sampler in ``samplers``.

    The prefill captures the widest query window any of them needs (every prompt query if one
    needs ``"all"``) and keeps the logits of the widest int window, so one prefill serves a
    pipeline alone and every method of an evaluation unit alike. The candidates are the first
    n - 1 prompt tokens query-aware (the last is re-fed through the compressed cache), all n
    otherwise. Nothing is checked here: validate with :meth:`Pipeline.check_input` first.
    """
    windows = [sampler.prefill_window for sampler in samplers]
    ints = [w for w in windows if w != "all"]
    check_supported(model)
    prepare(model)
    n = input_ids.shape[1]
    return ModelRollout(
        model,
        input_ids,
        evictable_layers(model),
        prefill_window="all" if "all" in windows else max(ints, default=0),
        tokenizer=tokenizer,
        candidates=n - 1 if query_aware else n,
        stats_window=max(ints, default=0),
        compile=compile,
    )


class Pipeline:
    """sampler + scorer + aggregator + policy. Parts may be components, configs, mappings or names.

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
        compile: bool = False,
    ) -> None:
        self.sampler: Sampler = sampler if isinstance(sampler, Sampler) else SAMPLERS.build(sampler)
        self.scorer: Scorer = scorer if isinstance(scorer, Scorer) else SCORERS.build(scorer)
        self.aggregator: Aggregator = (
            aggregator if isinstance(aggregator, Aggregator) else AGGREGATORS.build(aggregator)
        )
        self.policy: Policy = policy if isinstance(policy, Policy) else POLICIES.build(policy)
        self.compile = compile

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

    @classmethod
    def from_config(cls, config: PipelineConfig | Mapping[str, Any] | str | Path, *, compile: bool = False) -> Pipeline:
        if isinstance(config, (str, Path)):
            config = PipelineConfig.from_file(config)
        elif not isinstance(config, PipelineConfig):
            config = PipelineConfig.model_validate(dict(config))
        return cls(config.sampler, config.scorer, config.aggregator, config.policy, compile=compile)

    @property
    def config(self) -> PipelineConfig:
        return PipelineConfig(
            sampler=self.sampler.config,
            scorer=self.scorer.config,
            aggregator=self.aggregator.config,
            policy=self.policy.config,
        )

    def check_input(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        *,
        query_aware: bool,
        extra: int = 0,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        """Validate a prompt, the policy's budget and the positions the futures and the
        ``extra`` question/answer tokens need (both start at the prompt's end), before any
        model work."""
        minimum = 2 if query_aware else 1
        check_token_ids(model, input_ids, "input_ids", min_length=minimum)
        n = input_ids.shape[1]
        window = self.sampler.prefill_window
        if window != "all" and window > n:
            raise ValueError(f"window must be <= the prompt length {n}, got {window}")
        tail = 1 if query_aware else 0
        self.policy.check_budget(n - tail, tail)
        future = self.sampler.future_positions(input_ids, tokenizer)
        check_context(model, n, future, f"{self.sampler.config.name} future")
        check_context(model, n, extra, "question/answer")

    @torch.no_grad()
    def compress(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        *,
        query_aware: bool = True,
        tokenizer: PreTrainedTokenizerBase | None = None,
        answer_tokens: int = 0,
    ) -> CompressedCache:
        """Prefill, sample futures, score, aggregate, select; return the compressed cache.

        ``tokenizer`` is handed to the sampler through the rollout; only samplers that feed
        text of their own need it (``kvzip``'s repeat instruction), the others ignore it.
        ``answer_tokens``: positions the caller will feed after the prompt (question and
        answer), checked with the futures against the model's context before any work.
        """
        self.check_input(model, input_ids, query_aware=query_aware, extra=answer_tokens, tokenizer=tokenizer)
        timer = PhaseTimer(input_ids.device)
        with timer.phase("prefill"):
            rollout = self.prefill(model, input_ids, query_aware=query_aware, tokenizer=tokenizer)
        with timer.phase("sampling"):
            trajectories = self.sampler.futures(rollout)
        with timer.phase("scoring"):
            scores, weights = self.score(trajectories, rollout.candidates)
        return self.select(rollout, scores, weights, seconds=timer.seconds)

    def prefill(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        *,
        query_aware: bool = True,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> ModelRollout:
        """The first phase of :meth:`compress` (see :func:`prefill`); call :meth:`check_input`
        first, the phases check nothing themselves."""
        return prefill(
            model, input_ids, [self.sampler], query_aware=query_aware, tokenizer=tokenizer, compile=self.compile
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
        """The last phase of :meth:`compress`: the policy's selection of ``scores`` (L, H, c),
        gathered from the rollout's cache. ``seconds`` (the earlier phases' times) go into the stats."""
        timer = PhaseTimer(scores.device, seconds)
        n, candidates = rollout.prompt_length, rollout.candidates
        layers = tuple(sorted(rollout.evict_layers))
        with timer.phase("selection"):
            selection = self.policy.select(Scores(scores, layers, tail=n - candidates))
            source = rollout.head_cache if candidates < n else rollout.cache
            cache = gather(source, selection, limit=candidates)
        stats = CompressionStats(
            prompt_tokens=n,
            candidate_tokens=candidates,
            layer_indices=layers,
            kept=tuple(tuple(int(c) for c in row) for row in selection.counts().tolist()),
            bytes_before=rollout.cache.allocated_bytes(),
            bytes_after=cache.allocated_bytes(),
            bytes_kept=cache.kept_bytes(),
            pending_tokens=n - candidates,
            bytes_held=cache.held_bytes(n - candidates),
            seconds=timer.seconds,
            future_weights=tuple(weights.tolist()),
        )
        return CompressedCache(cache, rollout.prompt_ids, candidates, selection, stats)

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
        **generate_kwargs: Any,
    ) -> Generation:
        """Compress ``input_ids`` and decode an answer with ``model.generate`` (:func:`decode`).

        Without ``question_ids`` the prompt is compressed query-aware; with them the prompt
        is a context compressed query-agnostically and the question is fed after it.
        ``tokenizer`` is passed to :meth:`compress` (samplers that feed text need it).
        Greedy unless ``rule`` or ``generate_kwargs`` (any ``model.generate`` option:
        ``do_sample=True``, ``temperature``, a ``streamer``, ...) say otherwise.
        """
        check_int_at_least("max_new_tokens", max_new_tokens, 1)
        check_generate_options(model, generate_kwargs)
        extra = max_new_tokens + (0 if question_ids is None else question_ids.shape[-1])
        compressed = self.compress(
            model, input_ids, query_aware=question_ids is None, tokenizer=tokenizer, answer_tokens=extra
        )
        return decode(
            model, compressed, question_ids, max_new_tokens, eos_token_id=eos_token_id, rule=rule, **generate_kwargs
        )
