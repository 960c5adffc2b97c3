"""An evaluation grid: models x methods x budgets x tasks x lengths x modes, as one config.

A grid file (YAML or JSON) names everything a run needs, so that a results file can say
exactly what produced it (its hash is the run's identity: resuming and merging refuse a
results file of another grid). Methods are presets (the faithful baselines and LORE-KV),
pipeline files, or either with dotted overrides; the full cache is the method ``full``.
Budgets are kept tokens per KV head (``budgets``) or kvpress-style compression ratios
(``ratios``: the fraction of candidates evicted, so ratio r keeps round((1 - r) c) of c).
Tasks are generated families (:mod:`lorekv.eval.tasks`) or benchmark files
(:class:`~lorekv.eval.suites.task.FileTaskConfig`, a mapping with a ``format``). Modes say
what is compressed: the prompt with its question (``query_aware``), the context before its
question (``query_agnostic``), or the prompt and the answer alike while the answer is
generated (``decoding``: each method a :class:`~lorekv.schedule.DecodingSchedule`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from lorekv.eval.rows import FULL
from lorekv.eval.suites.task import FileTaskConfig, parse_file_task
from lorekv.eval.tasks import Sample, TaskConfig, check_length, make_sample, parse_task
from lorekv.models.bundled import BUNDLED
from lorekv.pipeline import PipelineConfig
from lorekv.presets import PRESETS, preset
from lorekv.schedule import BUFFER, DecodingSchedule, ScheduleConfig, schedule_preset
from lorekv.validation import describe

Mode = Literal["query_aware", "query_agnostic", "decoding"]


class MethodSpec(BaseModel):
    """One method of a grid, built anew at every budget.

    Attributes:
        name: the method's name in the results (defaults to the preset's name).
        preset: a preset name (see ``lorekv presets``), built with ``preset(name, B, **options)``.
        options: the preset's keyword arguments, e.g. ``{window: 8}`` for SnapKV.
        config: a pipeline config file or an inline config; its policy budget is set to B.
        set: dotted overrides applied last (``{"scorer.name": "loo"}``), or whole parts
            (``{"sampler": {"name": "prompt_window", "window": 8}}``).
        oracle: replace the sampler by the oracle future: the sample's gold answer,
            teacher-forced (a diagnostic upper reference for future-aware scoring).
        group: an ablation group; the report draws one bar chart per group.
        budgets: budgets for this method only (ablations at small budgets); default: the grid's.
        seeds: sampler seeds: the method runs once per seed (its sampler's ``seed`` set to each;
            a mixture's i-th seeded component to seed + i), its rows carry ``sampler_seed``, and
            the report averages each prompt over the seeds and shows the spread across them.
            Only for stochastic samplers (a sampler with a ``seed``).
        buffer: in ``decoding`` mode, the entries per KV head a row takes above B before it is
            compressed again (None: a preset's reference buffer, see
            :func:`~lorekv.schedule.schedule_preset`, else 64).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    preset: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    config: str | dict[str, Any] | None = None
    set: dict[str, Any] = Field(default_factory=dict)
    oracle: bool = False
    group: str | None = None
    budgets: list[int] | None = None
    seeds: list[int] | None = None
    buffer: int | None = Field(default=None, ge=1)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(s < 0 for s in value) or len(set(value)) != len(value)):
            raise ValueError(f"seeds must be a non-empty list of distinct integers >= 0, got {value}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"name": value} if value == FULL else {"name": value, "preset": value}
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MethodSpec:
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"preset: unknown {self.preset!r}; choose from {', '.join(sorted(PRESETS))}")
        if self.is_full:
            if any((self.preset, self.config, self.options, self.set, self.oracle, self.seeds, self.buffer)):
                raise ValueError(
                    f"method {FULL!r} is the full cache: it takes no preset, config, options, set, oracle, seeds "
                    "or buffer"
                )
            return self
        if (self.preset is None) == (self.config is None):
            raise ValueError(f"method {self.name or '?'}: give exactly one of preset or config")
        if self.oracle and self.seeds:
            raise ValueError(f"method {self.name or '?'}: the oracle future is teacher-forced; it takes no seeds")
        if self.options and self.preset is None:
            raise ValueError(f"method {self.name or '?'}: options are a preset's arguments; use set with a config")
        if not self.name:
            if self.preset is None:
                raise ValueError("method: a method given by config needs a name")
            object.__setattr__(self, "name", self.preset)
        return self

    @property
    def is_full(self) -> bool:
        return self.name == FULL and self.preset is None and self.config is None

    def build(self, budget: int, base: Path | None = None, seed: int | None = None) -> PipelineConfig:
        """The pipeline at ``budget`` kept tokens per KV head, its sampler at ``seed`` when given (oracle
        futures not yet filled in)."""
        config = self._build(budget, base)
        return config if seed is None else with_sampler_seed(config, seed, self.name)

    def schedule(self, budget: int, base: Path | None = None, seed: int | None = None) -> ScheduleConfig:
        """The method as a decoding schedule at ``budget`` (``decoding`` mode): a preset as
        :func:`~lorekv.schedule.schedule_preset` builds it, then ``set``, then the sampler's ``seed``."""
        if self.preset is not None:
            scheduled = schedule_preset(self.preset, budget, buffer=self.buffer, **self.options)
            config, buffer = self._with_set(scheduled.method, budget), scheduled.buffer
        else:
            config, buffer = self._build(budget, base), self.buffer or BUFFER
        config = config.for_mode(True)
        if seed is not None:
            config = with_sampler_seed(config, seed, self.name)
        return ScheduleConfig(method=config, buffer=buffer)

    def inlined(self, base: Path | None) -> MethodSpec:
        """This method with its pipeline file (relative to ``base``) read in as an inline config."""
        if not isinstance(self.config, str):
            return self
        try:
            config = self._pipeline(base)
        except ValueError as error:
            raise ValueError(f"method {self.name}: {error}") from None
        return self.model_copy(update={"config": config.model_dump(mode="json")})

    def _pipeline(self, base: Path | None) -> PipelineConfig:
        """The pipeline file (relative to ``base``) or inline config of a method given by config."""
        if isinstance(self.config, str):
            path = Path(self.config)
            return PipelineConfig.from_file(path if path.is_absolute() or base is None else base / path)
        return PipelineConfig.model_validate(self.config)

    def _build(self, budget: int, base: Path | None) -> PipelineConfig:
        if self.preset is not None:
            config = preset(self.preset, budget, **self.options)
        else:
            config = self._pipeline(base).override({"policy.budget": budget})
        return self._with_set(config, budget)

    def _with_set(self, config: PipelineConfig, budget: int) -> PipelineConfig:
        if not self.set:
            return config
        changed = config.override(self.set)
        if changed.policy.budget != budget:
            raise ValueError(
                f"method {self.name}: set changes the policy's budget to {changed.policy.budget}; "
                "the grid's budgets set it (use the method's budgets to choose them)"
            )
        return changed


def with_sampler_seed(config: PipelineConfig, seed: int, name: str) -> PipelineConfig:
    """``config`` with its samplers' ``seed`` set, the query-agnostic one's too (a mixture: its
    i-th seeded component's to ``seed + i``, so that two components of one kind do not draw the
    same futures)."""
    changes = {}
    for part in ("sampler", "agnostic_sampler"):
        sampler = getattr(config, part)
        seeded = None if sampler is None else _seeded(sampler.model_dump(), seed)
        if seeded is not None:  # field by field: the same components, the other parts untouched
            changes.update({f"{part}.{field}": seeded[field] for field in ("seed", "samplers") if field in seeded})
    if not changes:
        raise ValueError(f"method {name}: seeds need a stochastic sampler; {config.sampler.name} takes no seed")
    return config.override(changes)


def _seeded(sampler: dict[str, Any], seed: int) -> dict[str, Any] | None:
    """A sampler's dumped config with its seed(s) set as :func:`with_sampler_seed` says; None if it takes none."""
    if "seed" in sampler:
        return {**sampler, "seed": seed}
    parts = sampler.get("samplers") or []
    seeded = [i for i, part in enumerate(parts) if "seed" in part]
    for offset, i in enumerate(seeded):
        parts[i]["seed"] = seed + offset
    return sampler if seeded else None


def _parse_task(spec: Any) -> Any:
    """A benchmark file task from a mapping with a ``format``, a generated task from a name or mapping."""
    if isinstance(spec, Mapping) and "format" in spec and spec.get("name", "file") == "file":
        return parse_file_task(spec)
    return parse_task(spec) if isinstance(spec, (str, Mapping)) else spec


@dataclass(frozen=True)
class Budget:
    """A budget column: ``tokens`` kept per KV head, or a compression ``ratio``; None for the full cache."""

    tokens: int | None = None
    ratio: float | None = None

    @property
    def label(self) -> str:
        if self.tokens is not None:
            return f"B={self.tokens}"
        return FULL if self.ratio is None else f"ratio={self.ratio:g}"

    def resolve(self, candidates: int) -> int | None:
        """Kept tokens per KV head for a prompt of ``candidates`` eviction candidates."""
        if self.ratio is None:
            return self.tokens
        kept = round((1 - self.ratio) * candidates)
        if kept < 1:
            raise ValueError(f"ratio {self.ratio:g} keeps no token of {candidates} candidates; use a smaller ratio")
        return kept


FULL_BUDGET = Budget()


class GridConfig(BaseModel):
    """What to evaluate. Every list is a grid axis; cells are their product.

    Attributes:
        models: bundled names, local directories/GGUF files, or hub ids.
        dtype: the weights' dtype (bfloat16 on a GPU).
        device: where the model runs (``cpu``, ``cuda``, ``cuda:1``); with ``device_map``
            the model is placed by accelerate instead (e.g. ``auto`` for a large hub model).
        methods: presets by name, ``full``, or :class:`MethodSpec` mappings.
        budgets: kept tokens per KV head; ratios: compression ratios in (0, 1).
        tasks: task names or mappings (see ``lorekv.eval.tasks``), and benchmark files
            (mappings with a ``format``, see :class:`~lorekv.eval.suites.task.FileTaskConfig`).
        lengths: target prompt lengths in the model's tokens; for a benchmark file, the
            suite's prompt limit (a longer prompt is cut in the middle, as the suite does).
        modes: query_aware (question in the prompt), query_agnostic (context compressed
            alone, the question fed after it) and/or decoding (the whole prompt prefilled, then
            prompt and answer kept within B + the method's ``buffer`` entries per KV head while
            the answer is generated; budgets only, no ratios).
        samples: samples per (generated task, length); every method sees the same samples. A
            benchmark file's samples are its questions (its ``limit`` caps them).
        seed: the seed every sample is derived from.
        keep_maps: how many first samples per (model, task, length, mode) record the kept-token
            map of every cell (for the report's keep-map figure).
        batch_size: how many samples are prefilled, compressed and decoded together (units of
            one model, mode and length whose samples share ``max_new_tokens`` and whose
            unfinished cells are the same); the rows are those of batch size 1, their times
            those of the batch. An execution choice: not part of :attr:`digest`, so a run may
            resume, or its shards merge, at another batch size. Default 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "grid"
    models: list[str] = Field(default_factory=lambda: ["smollm2-135m-instruct"], min_length=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    device_map: str | None = None
    methods: list[MethodSpec] = Field(min_length=1)
    budgets: list[int] = Field(default_factory=list)
    ratios: list[float] = Field(default_factory=list)
    tasks: list[SerializeAsAny[TaskConfig]] = Field(min_length=1)
    lengths: list[int] = Field(min_length=1)
    modes: list[Mode] = Field(default_factory=lambda: ["query_aware"], min_length=1)
    samples: int | None = Field(default=None, ge=1)
    seed: int = Field(default=0, ge=0)
    keep_maps: int = Field(default=1, ge=0)
    batch_size: int = 1

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [_parse_task(v) for v in value]

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, value: list[int]) -> list[int]:
        if any(b < 1 for b in value) or len(set(value)) != len(value):
            raise ValueError(f"budgets must be distinct integers >= 1, got {value}")
        return value

    @field_validator("ratios")
    @classmethod
    def _ratios(cls, value: list[float]) -> list[float]:
        if any(not 0 < r < 1 for r in value) or len(set(value)) != len(value):
            raise ValueError(f"ratios must be distinct numbers in (0, 1), got {value}")
        return value

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {value!r}")
        return value

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, value: list[int]) -> list[int]:
        if any(n < 64 for n in value) or len(set(value)) != len(value):
            raise ValueError(f"lengths must be distinct integers >= 64, got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> GridConfig:
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"methods: names must be distinct, got {names}")
        labels = [t.label for t in self.tasks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"tasks: each task may appear once, got {labels}")
        if self.samples is None and any(not isinstance(t, FileTaskConfig) for t in self.tasks):
            raise ValueError("samples: generated tasks need a sample count (samples: N)")
        if any(not m.is_full for m in self.methods) and not (self.budgets or self.ratios):
            raise ValueError("budgets or ratios: at least one is needed for methods other than full")
        if "decoding" in self.modes and self.ratios:
            raise ValueError(
                "ratios: decoding mode bounds a cache whose length the answer decides; give budgets, not ratios"
            )
        for m in self.methods:
            if m.buffer is not None and "decoding" not in self.modes:
                raise ValueError(f"method {m.name}: buffer applies to the decoding mode, which this grid does not run")
            if m.budgets is not None and not set(m.budgets) <= set(self.budgets):
                raise ValueError(
                    f"method {m.name}: budgets {m.budgets} must be among the grid's budgets {self.budgets}"
                )
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> GridConfig:
        """Read a YAML/JSON grid; every error names the file."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such grid file")
        try:
            data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
        except (json.JSONDecodeError, yaml.YAMLError) as error:
            raise ValueError(f"{path}: not valid YAML/JSON: {error}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a grid must be a mapping (models, methods, budgets, tasks, lengths, ...)")
        try:
            grid = cls.model_validate(dict(data))
        except ValidationError as error:
            raise ValueError(f"{path}: {describe(error)}") from None
        try:
            grid = grid.resolved(path.parent)
            grid.check(base=path.parent)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        return grid

    def resolved(self, base: Path | None) -> GridConfig:
        """This grid with the benchmark files' relative paths made absolute against ``base`` (the
        grid file's folder) and every method's pipeline file read in, so that the digest and a
        results file's header hold the pipeline itself rather than a path to a file that may
        change. A relative path with ``base`` None is read from the working directory."""
        tasks = [t.resolved(base) if isinstance(t, FileTaskConfig) else t for t in self.tasks]
        methods = [m.inlined(base) for m in self.methods]
        return self.model_copy(update={"tasks": tasks, "methods": methods})

    @property
    def file_tasks(self) -> list[FileTaskConfig]:
        return [t for t in self.tasks if isinstance(t, FileTaskConfig)]

    def fingerprints(self) -> dict[str, str]:
        """Each benchmark file task's label -> the SHA-256 of its files (see
        :meth:`~lorekv.eval.suites.task.FileTaskConfig.fingerprint`)."""
        return {t.label: t.fingerprint() for t in self.file_tasks}

    def pipelines(self) -> dict[str, dict[str, Any]]:
        """What every (method, budget) column resolves to: ``"<method>|<budget label>"`` -> its
        pipeline config as built (before a method's ``seeds`` set its sampler's seed; a ratio
        column at the longest prompt's candidates; without its ``agnostic_`` parts when the
        grid has no query-agnostic mode, which never draws from it). A preset is a function
        whose defaults may change between versions, so a grid naming it means what this
        returns, not its name."""
        agnostic = "query_agnostic" in self.modes
        built = {
            f"{method.name}|{budget.label}": method.build(budget.resolve(max(self.lengths) - 1))
            for method in self.methods
            if not method.is_full
            for budget in self.budgets_of(method)
        }
        out = {
            key: (config if agnostic else config.for_mode(True)).model_dump(mode="json")
            for key, config in built.items()
        }
        if "decoding" in self.modes:  # budgets only: ratios are refused in this mode
            out.update({
                f"{method.name}|{budget.label}|decoding": method.schedule(int(budget.tokens)).model_dump(mode="json")
                for method in self.methods
                if not method.is_full
                for budget in self.budgets_of(method)
                if budget.tokens is not None
            })  # fmt: skip
        return out

    @property
    def digest(self) -> str:
        """A short hash of the grid's content, of the pipelines its methods resolve to
        (:meth:`pipelines`) and of its benchmark files' contents: the identity its results files
        carry, so that a changed preset default or pipeline file makes a new grid instead of one
        results file mixing two pipelines under one name (``batch_size``, which changes no
        result, and benchmark files' paths, which their fingerprints replace, left out: a
        checkout moved elsewhere resumes its results)."""
        dumped = self.model_dump(mode="json", exclude={"batch_size"})
        for task in dumped["tasks"]:
            if task.get("name") == "file":
                task["path"] = None  # the files' fingerprint says what they hold; where they lie may move
        content = {
            **dumped,
            "pipelines": self.pipelines(),
            **({"files": self.fingerprints()} if self.file_tasks else {}),
        }
        text = json.dumps(content, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def budgets_of(self, method: MethodSpec) -> list[Budget]:
        """The budget columns ``method`` is run at (the full cache: one column)."""
        if method.is_full:
            return [FULL_BUDGET]
        if method.budgets is not None:
            return [Budget(tokens=b) for b in method.budgets]
        return [Budget(tokens=b) for b in self.budgets] + [Budget(ratio=r) for r in self.ratios]

    def check(self, base: Path | None = None) -> None:
        """Check what can be checked without a model, so that bad input fails before one is
        loaded: every task fits every length, ``device_map`` names a loadable model, and every
        method builds at every budget (a ratio at the shortest prompt the lengths allow, its
        context alone in query-agnostic mode, and at the longest)."""
        for task in self.file_tasks:
            task.questions()
        for task in self.tasks:
            if isinstance(task, FileTaskConfig):
                continue
            for length in self.lengths:
                try:
                    check_length(length, task)
                except ValueError as error:
                    raise ValueError(f"lengths: {error}") from None
        if self.device_map is not None:
            local = [m for m in self.models if m in BUNDLED or m.endswith(".gguf")]
            if local:
                raise ValueError(f"device_map applies to transformers directories and hub ids, not {local}")
        for method in self.methods:
            if method.is_full:
                continue
            for budget in self.budgets_of(method):
                shortest = int(0.9 * min(self.lengths)) - 1
                if "query_agnostic" in self.modes:
                    shortest = int(0.8 * min(self.lengths))  # the question is not compressed
                candidates = {shortest, max(self.lengths) - 1}
                seed = None if method.seeds is None else method.seeds[0]
                for tokens in {budget.resolve(c) for c in candidates}:
                    try:
                        method.build(tokens, base, seed)
                        if "decoding" in self.modes:
                            DecodingSchedule.from_config(method.schedule(tokens, base, seed))
                    except (ValueError, TypeError) as error:
                        raise ValueError(f"method {method.name} at {budget.label}: {error}") from None


@dataclass(frozen=True)
class Unit:
    """One prompt of the grid: a sample of a task at a length, in a mode, on a model.

    Every (method, budget) cell of a unit shares its prefill, futures and scores.
    """

    model: str
    mode: Mode
    length: int
    task: TaskConfig
    index: int

    @property
    def key(self) -> str:
        return f"{self.model}|{self.mode}|n={self.length}|{self.task.label}|#{self.index}"

    def sample(self, tokenizer: Any, seed: int) -> Sample:
        if isinstance(self.task, FileTaskConfig):
            return self.task.sample(tokenizer, self.length, self.index, seed)
        return make_sample(self.task, tokenizer, self.length, self.index, seed)


def sample_groups(grid: GridConfig, task: TaskConfig) -> list[list[int]]:
    """The sample indices of ``task``, grouped by the context they share: one a group for a
    generated task, a row's questions for a benchmark file (consecutive indices)."""
    if not isinstance(task, FileTaskConfig):
        return [[index] for index in range(grid.samples or 0)]
    groups: list[list[int]] = []
    previous = None
    for index, question in enumerate(task.questions()):
        if question.record is not previous:
            groups.append([])
        groups[-1].append(index)
        previous = question.record
    return groups


def units(grid: GridConfig) -> Iterator[Unit]:
    """Every unit of ``grid`` in a fixed order: model, mode, length, sample, task.

    Sample-major within a (model, mode, length), so a run stopped early (or a shard) holds
    about as many samples of every task; a benchmark row's questions come one after the
    other (they share a context)."""
    groups = {task.label: sample_groups(grid, task) for task in grid.tasks}
    depth = max(len(g) for g in groups.values())
    for model in grid.models:
        for mode in grid.modes:
            for length in grid.lengths:
                for position in range(depth):
                    for task in grid.tasks:
                        for index in groups[task.label][position] if position < len(groups[task.label]) else []:
                            yield Unit(model, mode, length, task, index)


def cell_key(unit: Unit, method: str, budget: Budget, seed: int | None = None) -> str:
    """The results key of one (unit, method, budget, sampler seed) cell."""
    return f"{unit.key}|{method}|{budget.label}" + ("" if seed is None else f"|seed={seed}")
