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

:func:`run_units` runs a batch of units the same way, every phase once for the batch (the
prompts left-padded); each row's content is that of its unit run alone, its times those of
the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lorekv.eval.decoding import run_decoding_units
from lorekv.eval.grid import Budget, MethodSpec, Unit, cell_key
from lorekv.eval.results import encode_keep_map
from lorekv.eval.tasks import Sample
from lorekv.hf import (
    Generation,
    PhaseTimer,
    check_context,
    continue_full,
    decode_batch,
    left_pad,
    reference_prefill_seconds,
)
from lorekv.models.tokens import end_of_turn_ids
from lorekv.pipeline import Pipeline, prefill, select_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True, eq=False)
class Cell:
    """A (method, budget, sampler seed) column of the grid (compared by identity: its method holds dicts)."""

    method: MethodSpec
    budget: Budget
    seed: int | None = None

    def key(self, unit: Unit) -> str:
        """The results key of this cell on ``unit``."""
        return cell_key(unit, self.method.name, self.budget, self.seed)


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
    """Each non-full cell's budget (kept tokens per KV head) and pipeline in the prompt's mode
    (:meth:`~lorekv.pipeline.PipelineConfig.for_mode`), every input checked against the prompt
    before any model work."""
    built = {}
    for cell in cells:
        if cell.method.is_full:
            continue
        budget = cell.budget.resolve(prompt.candidates)
        config = cell.method.build(budget, base, cell.seed)
        if cell.method.oracle:  # the true answer's future, scored as the method scores, in both modes
            config = config.override({"sampler": {"name": "oracle", "token_ids": [oracle_ids(sample, tokenizer)]}})
        config = config.for_mode(prompt.query_aware)
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


def shared_contexts(contexts: Sequence[torch.Tensor]) -> tuple[list[int], list[int]]:
    """(owner, distinct): ``distinct`` the index of the first of each distinct (1, c) context,
    ``owner[i]`` the position in ``distinct`` of context i's first equal."""
    owner: list[int] = []
    distinct: list[int] = []
    for i, ids in enumerate(contexts):
        match = next((k for k, d in enumerate(distinct) if torch.equal(contexts[d], ids)), None)
        if match is None:
            distinct.append(i)
            match = len(distinct) - 1
        owner.append(match)
    return owner, distinct


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
    row per cell as soon as it is decoded (the caller writes it, so finished cells survive a
    crash). :func:`run_units` with one unit."""
    run_units(model, tokenizer, [unit], [sample], cells, emit, keep_maps=[keep_map], base=base)


def run_units(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    units: Sequence[Unit],
    samples: Sequence[Sample],
    cells: Sequence[Cell],
    emit: Callable[[dict[str, Any]], None],
    *,
    keep_maps: Sequence[bool] | None = None,
    base: Path | None = None,
) -> None:
    """Answer a batch of units (``samples[i]`` the sample of ``units[i]``) with every cell.

    The units must share a mode and the samples their ``max_new_tokens`` (one ``generate``
    call answers every row). The prompts are left-padded into one batch and prefilled once;
    each distinct sampler draws every row's futures together (``futures_batch``; row by row
    when the rows' samplers differ, as oracle futures do); each row is scored, and each cell
    selects every row with that row's own pipeline (a ratio budget resolves per row) and
    decodes every row in one ``decode_batch`` call (query-agnostic: the questions
    left-padded). The full cache answers each row from its own rows of the prefill, as alone.
    Query-agnostic, units whose contexts are the same tokens (the questions of one benchmark
    row) share one compression of it, as a deployment would: the context is a row of the batch
    once and each question decodes from its copy (not with oracle cells, whose future is each
    question's answer).
    Every row's content equals that of the unit run alone (tested), except its times:
    a batched unit's phase seconds (``prefill``, ``sampling``, ``scoring``, ``selection``,
    ``decode``) and its ``reference_prefill`` (transformers' prefill of the padded batch) are
    the batch's, shared by its rows. ``emit`` gets each row as soon as its cell is decoded.
    Units in ``decoding`` mode go to :func:`lorekv.eval.decoding.run_decoding_units`.
    ``keep_maps[i]``: whether unit i's rows record the kept-token map (default: none do).
    """
    if not cells or not units:
        return
    b = len(units)
    if len(samples) != b or (keep_maps is not None and len(keep_maps) != b):
        raise ValueError(f"samples and keep_maps must hold one entry per unit ({b})")
    if len({u.mode for u in units}) != 1 or len({s.max_new_tokens for s in samples}) != 1:
        raise ValueError("the units of a batch must share their mode and their samples' max_new_tokens")
    if units[0].mode == "decoding":
        run_decoding_units(model, tokenizer, units, samples, cells, emit, base=base)
        return
    keep_maps = [False] * b if keep_maps is None else list(keep_maps)
    query_aware = units[0].mode == "query_aware"
    max_new_tokens = samples[0].max_new_tokens
    prompts = [Prompt.of(sample, tokenizer, query_aware, model.device) for sample in samples]
    eos = end_of_turn_ids(tokenizer)
    built = [build_pipelines(cells, s, p, model, tokenizer, base) for s, p in zip(samples, prompts, strict=True)]
    for prompt in prompts:
        check_context(model, prompt.ids.shape[1], prompt.extra + max_new_tokens, "question/answer")
    golds = [s.answer_positions(tokenizer) if keep else None for s, keep in zip(samples, keep_maps, strict=True)]
    share = not query_aware and not any(cell.method.oracle for cell in cells)
    owner, distinct = shared_contexts([p.ids for p in prompts]) if share else (list(range(b)), list(range(b)))
    ids, mask = left_pad([prompts[d].ids for d in distinct])
    questions, question_mask = (None, None) if query_aware else left_pad([p.question for p in prompts])

    timer = PhaseTimer(model.device)
    with timer.phase("prefill"):
        samplers = [p.sampler for d in distinct for _, p in built[d].values()]
        lengths = [prompts[d].ids.shape[1] for d in distinct]
        scorers = [p.scorer for d in distinct for _, p in built[d].values()]
        norms = any(scorer.needs_query_norms for scorer in scorers)
        state_maps = {name: f for scorer in scorers for name, f in scorer.state_maps.items()}
        batch = prefill(
            model, ids, samplers, attention_mask=mask, lengths=lengths, query_aware=query_aware, tokenizer=tokenizer,
            query_norms=norms, state_maps=state_maps,
        )  # fmt: skip
    rollouts = [batch.rows[owner[i]] for i in range(b)]
    floor = reference_prefill_seconds(model, ids, None if len(distinct) == 1 else mask)

    def row(
        i: int, cell: Cell, budget: int | None, generation: Generation, seconds: dict[str, float], kept: Any
    ) -> None:
        unit, sample, prompt, rollout = units[i], samples[i], prompts[i], rollouts[i]
        stats = generation.stats
        prediction = generation.text(tokenizer)
        emit({
            "type": "row", "id": cell.key(unit), "model": unit.model,
            "task": sample.task, "length": unit.length, "mode": unit.mode, "index": unit.index,
            "seed": sample.seed, "sampler_seed": cell.seed, "method": cell.method.name, "group": cell.method.group,
            "budget_label": cell.budget.label, "budget": budget, "ratio": cell.budget.ratio,
            "tokens": prompt.ids.shape[1], "prediction": prediction, "answers": list(sample.answers),
            "metric": sample.metric, "score": sample.score(prediction),
            "kept": prompt.candidates if stats is None else float(np.mean(stats.kept)),
            "candidates": prompt.candidates,
            "kv_bytes_before": rollout.cache.allocated_bytes(),
            "kv_bytes_after": rollout.cache.allocated_bytes() if stats is None else stats.bytes_after,
            "seconds": {**seconds, "decode": generation.decode_seconds, "reference_prefill": floor},
            "compression_seconds": sum(seconds[phase] for phase in PHASES),
            "keep_map": kept, "gold_positions": golds[i], "suite": sample.suite, "tags": dict(sample.tags) or None,
            "futures": None if stats is None else len(stats.future_weights),
        })  # fmt: skip

    for cell in cells:
        if not cell.method.is_full:
            continue
        for i, (prompt, rollout) in enumerate(zip(prompts, rollouts, strict=True)):
            feed = prompt.ids[:, prompt.candidates :] if prompt.question is None else prompt.question
            generation = continue_full(
                model,
                rollout.head_cache if prompt.query_aware else rollout.cache,
                feed,
                prompt.candidates,
                max_new_tokens,
                eos_token_id=eos,
                prompt_ids=prompt.ids[:, : prompt.candidates],  # options that read the prompt see the real one
            )
            zero = {"sampling": 0.0, "scoring": 0.0, "selection": 0.0}
            row(i, cell, None, generation, {**timer.seconds, **zero}, None)  # it keeps everything: no map

    # Cells group by their samplers across the rows (an oracle's differs per row), then by scorer;
    # each distinct context is compressed, then copied to each of its questions.
    compressing = [built[d] for d in distinct]
    by_sampler: dict[tuple[str, ...], list[Cell]] = {}
    for cell in cells:
        if not cell.method.is_full:
            by_sampler.setdefault(tuple(_key(p[cell][1].sampler.config) for p in compressing), []).append(cell)
    for sampler_keys, group in by_sampler.items():
        with timer.phase("sampling"):
            samplers = [p[group[0]][1].sampler for p in compressing]
            if len(set(sampler_keys)) == 1:
                trajectories = samplers[0].futures_batch(batch)
            else:
                trajectories = [s.futures(r) for s, r in zip(samplers, batch.rows, strict=True)]
        by_scoring: dict[tuple[tuple[str, str], ...], list[Cell]] = {}
        for cell in group:
            key = tuple((_key(p[cell][1].scorer.config), _key(p[cell][1].aggregator.config)) for p in compressing)
            by_scoring.setdefault(key, []).append(cell)
        for scoring_group in by_scoring.values():
            with timer.phase("scoring"):
                scored = [
                    p[scoring_group[0]][1].score(t, prompts[d].candidates)
                    for p, t, d in zip(compressing, trajectories, distinct, strict=True)
                ]
            for cell in scoring_group:
                pipelines = [p[cell][1] for p in compressing]
                compressed = select_rows(pipelines, batch.rows, scored, seconds=timer.seconds)
                if len(distinct) < b:
                    compressed = compressed.rows(owner)
                generations = decode_batch(
                    model, compressed, questions, question_mask, max_new_tokens, eos_token_id=eos
                )
                for i, generation in enumerate(generations):
                    kept = None
                    if keep_maps[i]:
                        selection = compressed.selections[i]
                        kept = encode_keep_map(selection.mask().cpu().numpy(), selection.layer_indices)
                    row(i, cell, built[i][cell][0], generation, compressed.row_stats[i].seconds, kept)
            del scored
        del trajectories
