"""Running methods on prompts: one answer per (method, prompt), and the resumable needle benchmark."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict

from lorekv.eval.needle import make_task, prompt_ids
from lorekv.eval.results import ResultsFile
from lorekv.hf import Generation, generate_full
from lorekv.models.tokens import end_of_turn_ids
from lorekv.pipeline import Pipeline, PipelineConfig
from lorekv.presets import PRESETS, preset

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FULL = "full"
"""The method name of the full-cache baseline (nothing evicted)."""


def run_method(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: PipelineConfig | None,
    ids: torch.Tensor,
    max_new_tokens: int,
) -> tuple[Generation, float]:
    """Answer the query-aware prompt ``ids`` (1, n) greedily; ``config`` None is the full cache.

    Returns the generation and its wall-clock seconds (compression and decoding).
    """
    eos = end_of_turn_ids(tokenizer)
    start = time.perf_counter()
    if config is None:
        result = generate_full(model, ids, max_new_tokens, eos_token_id=eos)
    else:
        result = Pipeline.from_config(config).generate(
            model, ids, max_new_tokens, eos_token_id=eos, tokenizer=tokenizer
        )
    return result, time.perf_counter() - start


def resolve_methods(
    names: Iterable[str],
    budget: int | None,
    config_files: Sequence[Path] = (),
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, PipelineConfig | None]:
    """Method name -> config (None for the full cache), checked before any model work.

    Presets are built at ``budget``; config files (named by their stem) keep the values they
    hold. ``overrides`` (dotted paths, see :meth:`PipelineConfig.override`) apply to every
    pipeline, presets and files alike.
    """
    names = list(names)
    unknown = [m for m in names if m != FULL and m not in PRESETS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; choose from {FULL}, {', '.join(sorted(PRESETS))}")
    if any(m != FULL for m in names) and budget is None:
        raise ValueError("budget is required for presets")
    methods: dict[str, PipelineConfig | None] = {m: None if m == FULL else preset(m, budget) for m in names}
    for path in config_files:
        if path.stem in methods:
            raise ValueError(f"config {path}: the method name {path.stem!r} is taken; rename the file")
        methods[path.stem] = PipelineConfig.from_file(path)
    if overrides:
        methods = {name: None if c is None else c.override(overrides) for name, c in methods.items()}
    if not methods:
        raise ValueError("methods: nothing to run; name at least one method or config")
    return methods


def method_budget(config: PipelineConfig | None) -> int | None:
    """B of a pipeline config, None for the full cache."""
    return None if config is None else config.policy.budget


class NeedleRow(BaseModel):
    """One answered needle question: the schema of the needle benchmark's results file."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    model: str
    method: str
    budget: int | None
    haystack: int
    tokens: int
    seed: int
    depth: float
    answer: str
    correct: bool
    seconds: float
    stats: dict[str, Any] | None


def needle_results(path: str | Path) -> ResultsFile:
    """The needle benchmark's results file at ``path``, rows checked against :class:`NeedleRow`."""
    return ResultsFile(path, schema=NeedleRow)


def needle_key(model_name: str, method: str, config: PipelineConfig | None, tokens: int, seed: int) -> str:
    budget = method_budget(config)
    return f"{model_name}|{method}|B={'all' if budget is None else budget}|n={tokens}|seed={seed}"


def needle_depth(trial: int) -> float:
    """The needle's depth in trial ``trial``: six depths from 1/12 to 11/12, in turn."""
    return (trial % 6 + 0.5) / 6


def run_needle(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model_name: str,
    methods: Mapping[str, PipelineConfig | None],
    results: ResultsFile,
    trials: int,
    tokens: int,
    max_new_tokens: int = 16,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Answer ``trials`` needle questions of ~``tokens`` haystack tokens with every method.

    One row per (trial, method) is added to ``results``; rows already there are skipped, so
    an interrupted run resumes where it stopped. ``report`` is called with each new row.
    """
    for trial in range(trials):
        depth = needle_depth(trial)
        task = make_task(tokenizer, tokens, depth, seed=trial)
        ids = prompt_ids(tokenizer, task)
        for name, config in methods.items():
            key = needle_key(model_name, name, config, tokens, trial)
            if key in results.done():
                continue
            result, seconds = run_method(model, tokenizer, config, ids, max_new_tokens)
            answer = tokenizer.decode(result.token_ids, skip_special_tokens=True)
            row = {
                "id": key, "model": model_name, "method": name, "budget": method_budget(config),
                "haystack": tokens, "tokens": int(ids.shape[1]), "seed": trial, "depth": depth,
                "answer": answer, "correct": task.is_correct(answer), "seconds": seconds,
                "stats": None if result.stats is None else result.stats.to_dict(),
            }  # fmt: skip
            results.add(row)
            if report is not None:
                report(row)


@dataclass(frozen=True)
class MethodSummary:
    """Needle accuracy of one method: ``correct`` of ``trials``, median seconds per answer."""

    method: str
    budget: int | None
    correct: int
    trials: int
    median_seconds: float


def summarize_needle(
    results: ResultsFile, *, model_name: str, methods: Mapping[str, PipelineConfig | None], tokens: int
) -> list[MethodSummary]:
    """One summary per method that has rows for (model, its budget, haystack length)."""
    out = []
    for name, config in methods.items():
        budget = method_budget(config)
        rows = [
            r for r in results.records
            if (r["model"], r["method"], r["budget"], r["haystack"]) == (model_name, name, budget, tokens)
        ]  # fmt: skip
        if rows:
            median = statistics.median(r["seconds"] for r in rows)
            out.append(MethodSummary(name, budget, sum(r["correct"] for r in rows), len(rows), median))
    return out
