"""How closely a fitted surrogate follows its teacher on a context: the rank correlation of their
scores per layer, and the overlap of the sets their pipelines keep at a budget.

Both read one recording of the context (:func:`~lorekv.distill.run.record_context`: the
teacher's scores and the hidden states of every candidate token), so the student's scores are
its map of the very states the teacher's prefill saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lorekv.distill.calibration import Context
from lorekv.distill.fit import held_out_report
from lorekv.distill.run import DistillConfig, record_context
from lorekv.pipeline import Pipeline
from lorekv.scorers.surrogate import SurrogateScorer
from lorekv.scores import Scores

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Fidelity:
    """A student against its teacher on one context.

    Attributes:
        context: the context's name.
        tokens: its candidates.
        spearman: per layer, the rank correlation over tokens of the student's and the teacher's
            scores (mean over KV heads).
        overlap: budget -> |kept by both| / |kept by the teacher|, each pipeline's own policy
            at that budget.
    """

    context: str
    tokens: int
    spearman: tuple[float, ...]
    overlap: dict[int, float]


def fidelity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    student: Pipeline,
    teacher: Pipeline,
    context: Context,
    budgets: list[int],
) -> Fidelity:
    """``student`` (a ``surrogate``-scored pipeline) against ``teacher`` on ``context``,
    query-agnostic, at each of ``budgets``."""
    if not isinstance(student.scorer, SurrogateScorer):
        raise ValueError(f"the student must score with a fitted surrogate, not {student.scorer.config.name}")
    config = DistillConfig(tokens_per_context=context.ids.shape[1], floor=1e-30)
    states, targets = record_context(model, tokenizer, teacher, context, config)  # (c, L, D), (c, L, G)
    with torch.no_grad():
        predicted = student.scorer.map.all_layers(states).double()
    report = held_out_report(student.scorer.map, states, targets)
    layers = tuple(fit.layer for fit in report.layers)
    overlap = {}
    for budget in budgets:
        change = {"policy.budget": budget}
        ours = Pipeline.from_config(student.config.override(change)).policy
        theirs = Pipeline.from_config(teacher.config.for_mode(False).override(change)).policy
        kept = ours.select(Scores(predicted.exp().permute(1, 2, 0), layers)).mask()
        wanted = theirs.select(Scores(targets.double().exp().permute(1, 2, 0), layers)).mask()
        overlap[budget] = float((kept & wanted).sum() / wanted.sum())
    return Fidelity(context.name, states.shape[0], tuple(fit.spearman for fit in report.layers), overlap)
