"""Calibration contexts: the texts a teacher scores so that a surrogate can be fitted on them.

Three sources, every one shipped with lorekv or given by the user, none downloaded: the generated
task families of ``lorekv eval`` (their contexts, without the question: what a query-agnostic
compression sees), runs of the haystack prose those families hide their needles in (the Python
reference manual's sentences), and any benchmark file a grid reads (``{format: jsonl, path: ...}``,
LongBench, RULER, ...). Each context is identified by the SHA-256 of its token ids, which the fitted
file lists, so that a fit says exactly what it saw.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lorekv.eval.suites.task import FileTaskConfig, parse_file_task
from lorekv.eval.tasks import make_sample, parse_task
from lorekv.eval.tasks.haystack import haystack_sentences
from lorekv.eval.tasks.words import prose_sentences
from lorekv.models.tokens import chat_text, encode

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_TASKS = ("variable_tracking", "common_words", "frequent_words", "qa")
"""The task families the default calibration draws from: tracing, aggregation and question
answering; the needle families (retrieval) are left out, so that the needle grids and files
measure a fit on families it never saw."""


class CalibrationConfig(BaseModel):
    """Which contexts a teacher scores.

    Attributes:
        tasks: task families (names or mappings with options, as a grid's ``tasks``) and
            benchmark files (mappings with a ``format``); ``samples`` contexts of each.
        samples: contexts per task (a file task: its first questions' distinct contexts).
        haystack: contexts of plain haystack prose (the reference manual's sentences from a
            seeded starting sentence), >= 0.
        length: each context's token budget (a task's prompt fills 90-100% of it, a haystack
            context is cut to it), >= 256.
        seed: the samples' seed (a task family draws sample ``index`` from it) and the haystack's.
    """

    model_config = ConfigDict(extra="forbid")

    tasks: list[Any] = Field(default_factory=lambda: list(DEFAULT_TASKS))
    samples: int = Field(default=6, ge=1, strict=True)
    haystack: int = Field(default=8, ge=0, strict=True)
    length: int = Field(default=2048, ge=256, strict=True)
    seed: int = Field(default=0, ge=0, strict=True)

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, value: list[Any]) -> list[Any]:
        for spec in value:
            _parse(spec)
        return value


@dataclass(frozen=True, eq=False)
class Context:
    """One calibration context.

    Attributes:
        name: where it comes from (``niah_single#0``, ``haystack#2``, ``jsonl/qa#1``).
        ids: (1, n) its token ids, the chat template's opening included (what a query-agnostic
            compression of it prefills).
    """

    name: str
    ids: torch.Tensor

    @property
    def sha256(self) -> str:
        """The SHA-256 of its token ids (int64, little-endian)."""
        return hashlib.sha256(self.ids.to(torch.int64).numpy().astype("<i8").tobytes()).hexdigest()


def _parse(spec: Any) -> Any:
    if isinstance(spec, dict) and "format" in spec:
        return parse_file_task(spec)
    return parse_task(spec)


def contexts(config: CalibrationConfig, tokenizer: PreTrainedTokenizerBase) -> list[Context]:
    """Every calibration context of ``config``, in order: each task's, then the haystack's; a
    context met twice (two questions of one file row) is listed once."""
    out: list[Context] = []
    for spec in config.tasks:
        task = _parse(spec)
        if isinstance(task, FileTaskConfig):
            count = min(config.samples, len(task.questions()))
            samples = [task.sample(tokenizer, config.length, i, config.seed) for i in range(count)]
        else:
            samples = [make_sample(task, tokenizer, config.length, i, config.seed) for i in range(config.samples)]
        for i, sample in enumerate(samples):
            out.append(Context(f"{sample.task}#{i}", sample.context_and_question_ids(tokenizer)[0]))
    rng = random.Random(config.seed)
    for i in range(config.haystack):
        start = rng.randrange(len(haystack_sentences()))
        words = config.length  # more words than tokens fit: cut to the length below
        text = chat_text(tokenizer, " ".join(prose_sentences(start, words)))
        out.append(Context(f"haystack#{i}", encode(tokenizer, text)[:, : config.length]))
    seen: set[str] = set()
    unique = []
    for context in out:
        if context.sha256 not in seen:
            seen.add(context.sha256)
            unique.append(context)
    return unique
