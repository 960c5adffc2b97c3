"""Every (method, budget) cell of one prompt, from work done once.

Prefill depends only on the prompt; a sampler's futures depend on the prompt and the
sampler; the scores on those and the scorer and aggregator. None depends on the budget,
which changes only the selection and the decode. So a unit (one sample in one mode) is
prefilled once, with the union of the query windows its methods need; each distinct
sampler's futures are drawn once; each distinct (sampler, scorer, aggregator) scores once;
and every cell then selects, gathers and decodes on its own. Each phase is exactly the
call :meth:`lorekv.pipeline.Pipeline.compress` makes, so a cell's answer is that of an
independent ``Pipeline.generate`` (tested); the full cache answers from the shared prefill.

A cell's reported times are what a standalone run would pay: the shared prefill, its
sampler's futures and its scorer's scores are counted in every cell that uses them (the
shared prefill captures the widest query window any method needs: it stores the queries the
prefill computes anyway, so a cell with a narrow window pays slightly more than it would alone).
Each unit also times transformers' own SDPA prefill of the prompt (``reference_prefill``),
the floor every method pays, so costs can be stated as ratios to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lorekv.eval.grid import Budget, MethodSpec, Unit, cell_key
from lorekv.eval.results import encode_keep_map
from lorekv.eval.tasks import Sample
from lorekv.hf import (
    CompressedCache,
    Generation,
    PhaseTimer,
    check_context,
    continue_full,
    decode,
    reference_prefill_seconds,
)
from lorekv.models.tokens import end_of_turn_ids
from lorekv.pipeline import Pipeline, prefill

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True, eq=False)
class Cell:
    """A (method, budget) column of the grid (compared by identity: its method holds dicts)."""

    method: MethodSpec
    budget: Budget


@dataclass(frozen=True)
class Prompt:
    """A sample's token ids in one mode: ``ids`` (1, n) compressed; ``question`` (1, q) fed after
    them query-agnostically (None query-aware, where the question is part of ``ids``)."""

    ids: torch.Tensor
    question: torch.Tensor | None

    @classmethod
    def of(
        cls, sample: Sample, tokenizer: PreTrainedTokenizerBase, query_aware: bool, device: torch.device | str = "cpu"
    ) -> Prompt:
        if query_aware:
            return cls(sample.prompt_ids(tokenizer).to(device), None)
        context, question = sample.context_and_question_ids(tokenizer)
        return cls(context.to(device), question.to(device))

    @property
    def query_aware(self) -> bool:
        return self.question is None

    @property
    def candidates(self) -> int:
        """Eviction candidates: the prompt less its re-fed last token query-aware, all of it otherwise."""
        return self.ids.shape[1] - (1 if self.query_aware else 0)

    @property
    def extra(self) -> int:
        return 0 if self.question is None else self.question.shape[1]


def oracle_ids(sample: Sample, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The gold answer as the model should write it after the answer prefix (every gold
    answer, comma-separated), teacher-forced as the oracle future."""
    return tokenizer(" " + ", ".join(sample.answers), add_special_tokens=False)["input_ids"]


def build_pipelines(
    cells: Sequence[Cell],
    sample: Sample,
    prompt: Prompt,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    base: Path | None = None,
) -> dict[Cell, tuple[int, Pipeline]]:
    """Each non-full cell's budget (kept tokens per KV head) and pipeline, every input checked
    against the prompt before any model work."""
    built = {}
    for cell in cells:
        if cell.method.is_full:
            continue
        budget = cell.budget.resolve(prompt.candidates)
        config = cell.method.build(budget, base)
        if cell.method.oracle:
            config = config.override({"sampler": {"name": "oracle", "token_ids": [oracle_ids(sample, tokenizer)]}})
        pipeline = Pipeline.from_config(config)
        try:
            pipeline.check_input(
                model,
                prompt.ids,
                query_aware=prompt.query_aware,
                extra=prompt.extra + sample.max_new_tokens,
                tokenizer=tokenizer,
            )
        except ValueError as error:
            raise ValueError(f"method {cell.method.name} at {cell.budget.label}: {error}") from None
        built[cell] = (budget, pipeline)
    return built


PHASES = ("prefill", "sampling", "scoring", "selection")
"""The phases of compression; a row's ``compression_seconds`` is their sum."""


def _key(config: Any) -> str:
    return config.model_dump_json()


def run_unit(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    unit: Unit,
    sample: Sample,
    cells: Sequence[Cell],
    emit: Callable[[dict[str, Any]], None],
    *,
    keep_map: bool = False,
    base: Path | None = None,
) -> None:
    """Answer ``sample`` with every cell, sharing prefill, futures and scores; ``emit`` gets one
    row per cell as soon as it is decoded (the caller writes it, so finished cells survive a crash)."""
    if not cells:
        return
    prompt = Prompt.of(sample, tokenizer, unit.mode == "query_aware", model.device)
    eos = end_of_turn_ids(tokenizer)
    built = build_pipelines(cells, sample, prompt, model, tokenizer, base)
    n = prompt.ids.shape[1]
    check_context(model, n, prompt.extra + sample.max_new_tokens, "question/answer")
    gold = sample.answer_positions(tokenizer) if keep_map else None

    timer = PhaseTimer(model.device)
    with timer.phase("prefill"):
        samplers = [p.sampler for _, p in built.values()]
        rollout = prefill(model, prompt.ids, samplers, query_aware=prompt.query_aware, tokenizer=tokenizer).rows[0]
    floor = reference_prefill_seconds(model, prompt.ids)

    def row(cell: Cell, budget: int | None, generation: Generation, seconds: dict[str, float], kept: Any) -> None:
        stats = generation.stats
        prediction = generation.text(tokenizer)
        emit({
            "type": "row", "id": cell_key(unit, cell.method.name, cell.budget), "model": unit.model,
            "task": unit.task.label, "length": unit.length, "mode": unit.mode, "index": unit.index,
            "seed": sample.seed, "method": cell.method.name, "group": cell.method.group,
            "budget_label": cell.budget.label, "budget": budget, "ratio": cell.budget.ratio, "tokens": n,
            "prediction": prediction, "answers": list(sample.answers), "metric": sample.metric,
            "score": sample.score(prediction),
            "kept": prompt.candidates if stats is None else float(np.mean(stats.kept)),
            "candidates": prompt.candidates,
            "kv_bytes_before": rollout.cache.allocated_bytes(),
            "kv_bytes_after": rollout.cache.allocated_bytes() if stats is None else stats.bytes_after,
            "seconds": {**seconds, "decode": generation.decode_seconds, "reference_prefill": floor},
            "compression_seconds": sum(seconds[phase] for phase in PHASES),
            "keep_map": kept, "gold_positions": gold,
        })  # fmt: skip

    for cell in cells:
        if cell.method.is_full:
            feed = prompt.ids[:, prompt.candidates :] if prompt.question is None else prompt.question
            cache = rollout.head_cache if prompt.query_aware else rollout.cache
            generation = continue_full(
                model,
                cache,
                feed,
                prompt.candidates,
                sample.max_new_tokens,
                eos_token_id=eos,
                prompt_ids=prompt.ids[:, : prompt.candidates],  # options that read the prompt see the real one
            )
            zero = {"sampling": 0.0, "scoring": 0.0, "selection": 0.0}
            row(cell, None, generation, {**timer.seconds, **zero}, None)  # it keeps everything: no map

    by_sampler: dict[str, list[Cell]] = {}
    for cell, (_, pipeline) in built.items():
        by_sampler.setdefault(_key(pipeline.sampler.config), []).append(cell)
    for group in by_sampler.values():
        with timer.phase("sampling"):
            trajectories = built[group[0]][1].sampler.futures(rollout)
        by_scoring: dict[tuple[str, str], list[Cell]] = {}
        for cell in group:
            pipeline = built[cell][1]
            by_scoring.setdefault((_key(pipeline.scorer.config), _key(pipeline.aggregator.config)), []).append(cell)
        for scoring_group in by_scoring.values():
            with timer.phase("scoring"):
                scores, weights = built[scoring_group[0]][1].score(trajectories, prompt.candidates)
            for cell in scoring_group:
                budget, pipeline = built[cell]
                compressed: CompressedCache = pipeline.select(rollout, scores, weights, seconds=timer.seconds)
                generation = decode(model, compressed, prompt.question, sample.max_new_tokens, eos_token_id=eos)
                seconds = compressed.stats.seconds
                kept = None
                if keep_map:
                    selection = compressed.selection
                    kept = encode_keep_map(selection.mask().cpu().numpy(), selection.layer_indices)
                row(cell, budget, generation, seconds, kept)
        del trajectories
