"""Every cell of a unit in ``decoding`` mode: the cache kept within its budget while the answer is written.

Nothing is compressed before the answer. Each method is a
:class:`~lorekv.schedule.DecodingSchedule` (:meth:`~lorekv.eval.grid.MethodSpec.schedule`):
the whole prompt is prefilled, and the prompt and answer alike are compressed back to B
entries per KV head whenever a row holds B + ``buffer``. This is the setting of long outputs
(R-KV, https://arxiv.org/abs/2505.24133; kvpress's ``DecodingPress``). The full cache writes
into transformers' own cache. A batch's prompts are left-padded and generated together, each
row compressed on its own schedule, so its content is that of the row alone (tested).

The row's fields in this mode:

- ``kept``: the most entries per KV head the row held after a model call (the whole prompt
  after the prefill when it is longer than B + ``buffer``).
- ``candidates``: every token fed (the prompt, and the answer but its last token).
- ``kv_bytes_before``: what transformers' cache holds for those tokens.
- ``kv_bytes_after``: the row's share of the bytes its bounded cache allocated, reserved room
  included (the full cache: ``kv_bytes_before``).
- ``compression_seconds``: the seconds spent compressing, a part of ``decode``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorekv.eval.grid import Unit
from lorekv.eval.tasks import Sample
from lorekv.hf import (
    Generation,
    full_cache,
    full_cache_bytes,
    generate_full_batch,
    left_pad,
    reference_prefill_seconds,
)
from lorekv.models.tokens import end_of_turn_ids
from lorekv.schedule import DecodingSchedule

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from lorekv.eval.shared import Cell


def run_decoding_units(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    units: Sequence[Unit],
    samples: Sequence[Sample],
    cells: Sequence[Cell],
    emit: Callable[[dict[str, Any]], None],
    *,
    base: Path | None = None,
) -> None:
    """Answer a batch of ``decoding``-mode units (``samples[i]`` the sample of ``units[i]``,
    sharing ``max_new_tokens``) with every cell, one ``generate`` call a cell; ``emit`` gets
    each row as soon as its cell has answered. Every schedule is built, and so checked, before
    any model work."""
    schedules = {
        cell: DecodingSchedule.from_config(cell.method.schedule(cell.budget.tokens, base, cell.seed))
        for cell in cells
        if not cell.method.is_full
    }
    for schedule in schedules.values():
        schedule.check_model(model)
    ids, mask = left_pad([s.prompt_ids(tokenizer).to(model.device) for s in samples])
    lengths = [int(n) for n in mask.sum(1)]
    max_new_tokens = samples[0].max_new_tokens
    eos = end_of_turn_ids(tokenizer)
    floor = reference_prefill_seconds(model, ids, None if len(samples) == 1 else mask)
    b = len(samples)

    for cell in cells:
        schedule = schedules.get(cell)
        cache = full_cache(model) if schedule is None else schedule.cache(model, b)
        generations = generate_full_batch(model, ids, mask, max_new_tokens, eos_token_id=eos, cache=cache)
        for i, generation in enumerate(generations):
            fed = lengths[i] + len(generation.token_ids) - 1
            full_bytes = full_cache_bytes(model, fed)
            if schedule is None:
                kept, held_bytes, compressing = fed, full_bytes, 0.0
            else:
                kept, held_bytes, compressing = cache.bound.peak[i], cache.allocated_bytes() // b, cache.bound.seconds
            emit(_row(units[i], samples[i], cell, schedule, generation, tokenizer, lengths[i], fed, kept,
                      full_bytes, held_bytes, compressing, floor))  # fmt: skip


def _row(
    unit: Unit,
    sample: Sample,
    cell: Cell,
    schedule: DecodingSchedule | None,
    generation: Generation,
    tokenizer: PreTrainedTokenizerBase,
    tokens: int,
    fed: int,
    kept: int,
    full_bytes: int,
    held_bytes: int,
    compressing: float,
    floor: float,
) -> dict[str, Any]:
    prediction = generation.text(tokenizer)
    phases = {"prefill": 0.0, "sampling": 0.0, "scoring": 0.0, "selection": 0.0}
    return {
        "type": "row", "id": cell.key(unit), "model": unit.model,
        "task": sample.task, "length": unit.length, "mode": unit.mode, "index": unit.index,
        "seed": sample.seed, "sampler_seed": cell.seed, "method": cell.method.name, "group": cell.method.group,
        "budget_label": cell.budget.label, "budget": None if schedule is None else schedule.budget,
        "ratio": None, "tokens": tokens, "prediction": prediction, "answers": list(sample.answers),
        "metric": sample.metric, "score": sample.score(prediction), "kept": float(kept), "candidates": fed,
        "kv_bytes_before": full_bytes, "kv_bytes_after": held_bytes,
        "seconds": {**phases, "decode": generation.decode_seconds, "reference_prefill": floor},
        "compression_seconds": compressing, "keep_map": None, "gold_positions": None,
        "suite": sample.suite, "tags": dict(sample.tags) or None, "futures": None,
    }  # fmt: skip
