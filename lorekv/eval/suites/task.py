"""A grid task read from a benchmark's own files: which rows, and how each question becomes a sample.

``{format: longbench, path: data/longbench}`` in a grid's ``tasks`` reads every row of the
files (or of a hub dataset, with ``hub``), parses it with the format
(:data:`~lorekv.eval.suites.record.FORMATS`), keeps the sub-tasks asked for and, per sub-task,
the first ``limit`` rows (or ``limit`` rows drawn with ``seed``, in file order). Every question
of every kept row is one sample; the questions of one row are consecutive, so that a
query-agnostic run compresses their shared context once. Everything but the token counts is
checked when the grid is (before a model loads); a sample is built with the model's tokenizer:
the grid's length is the suite's prompt limit, and a longer prompt is cut in the middle as the
suite does (:func:`truncate_middle`), or refused where the suite does not truncate. The
questions of one row share one context, cut for the longest of them (a suite that asks each
question alone cuts each prompt for its own question: a shorter question there keeps a few
more context tokens).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from lorekv.eval.suites import (  # noqa: F401  (registration)
    generic,
    infinitebench,
    longbench,
    longbench_v2,
    loogle,
    ruler,
    scbench,
)
from lorekv.eval.suites.reader import SourceRow, files_of, read_file, read_hub
from lorekv.eval.suites.record import FORMATS, Record, RowError
from lorekv.eval.tasks.base import TaskConfig
from lorekv.eval.tasks.sample import Sample
from lorekv.models.tokens import SPLIT

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class FileTaskConfig(TaskConfig):
    """A benchmark read from its files.

    Attributes:
        format: the suite's row format (``longbench``, ``longbench_v2``, ``ruler``,
            ``ruler_unified``, ``infinitebench``, ``loogle``, ``scbench``, ``jsonl``).
        path: a file or a folder of ``.jsonl``/``.json`` files (relative: to the grid file's folder).
        hub: instead of ``path``, a dataset for ``datasets.load_dataset`` (a hub id, or a builder
            such as ``json`` with ``data_files``); ``configs`` are loaded one after the other.
        subtasks: the sub-tasks to keep (LongBench datasets, RULER tasks, ...); empty: all.
        limit: at most this many rows per sub-task; None: all.
        seed: draw the ``limit`` rows at random with this seed (kept in file order) instead of
            taking the first ones.
        metric: a metric name replacing the format's (the generic ``jsonl`` format's default).
        title: the task's name in results (default: the format's); sub-task rows are
            ``title/subtask``.
    """

    name: Literal["file"] = "file"
    format: str
    path: str | None = None
    hub: str | None = None
    configs: list[str] = Field(default_factory=list)
    split: str = "test"
    data_files: str | None = None
    subtasks: list[str] = Field(default_factory=list)
    limit: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0)
    metric: str | None = None
    title: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> FileTaskConfig:
        if self.format not in FORMATS:
            raise ValueError(f"format: unknown {self.format!r}; choose from {', '.join(sorted(FORMATS))}")
        if (self.path is None) == (self.hub is None):
            raise ValueError(f"task {self.label}: give exactly one of path (a local file or folder) or hub")
        if self.hub is None and (self.configs or self.data_files):
            raise ValueError(f"task {self.label}: configs and data_files apply to a hub dataset (hub: ...)")
        if self.seed is not None and self.limit is None:
            raise ValueError(f"task {self.label}: seed draws a subset of limit rows; give limit too")
        FORMATS[self.format].check_subtasks(self.subtasks)
        if self.metric is not None:
            from lorekv.eval.suites.metrics import metric

            metric(self.metric)
        return self

    @property
    def label(self) -> str:
        return self.title or self.format

    def resolved(self, base: Path | None) -> FileTaskConfig:
        """This config with a relative ``path`` made absolute against ``base`` (the grid file's folder)."""
        if self.path is None or base is None or Path(self.path).is_absolute():
            return self
        return self.model_copy(update={"path": str((base / self.path).resolve())})

    def questions(self) -> list[Question]:
        """Every question of the task in order (read once per file content; see :func:`load`)."""
        return load(self)

    def fingerprint(self) -> str:
        """A SHA-256 of the files read (``hub:<id>`` for a hub dataset): part of a grid's identity."""
        if self.path is None:
            return f"hub:{self.hub}:{self.configs}:{self.split}:{self.data_files}"
        digest = hashlib.sha256()
        for file in files_of(Path(self.path)):
            digest.update(file.name.encode())
            digest.update(_file_digest(file, file.stat().st_size, file.stat().st_mtime_ns).encode())
        return digest.hexdigest()

    def sample(self, tokenizer: PreTrainedTokenizerBase, length: int, index: int, seed: int) -> Sample:
        """Question ``index`` as a sample whose prompt keeps within ``length`` tokens (the suite's limit)."""
        questions = self.questions()
        if not 0 <= index < len(questions):
            raise ValueError(f"task {self.label}: index must be in [0, {len(questions)}), got {index}")
        return questions[index].sample(self, tokenizer, length, index, seed)


@dataclass(frozen=True)
class Question:
    """Turn ``turn`` of a record read at ``where``."""

    record: Record
    turn: int
    where: str

    def sample(
        self, config: FileTaskConfig, tokenizer: PreTrainedTokenizerBase, length: int, index: int, seed: int
    ) -> Sample:
        record, turn = self.record, self.record.turns[self.turn]
        # A row's questions share one context, cut for its longest question, so that every
        # question fits and a query-agnostic run compresses the context once for them all.
        tails = [record.separator + t.question for t in record.turns]
        tail = max(tails, key=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
        context = record.context
        count = len(tokenizer(context + tail)["input_ids"])
        if count > length:
            if not record.truncate:
                raise ValueError(
                    f"{self.where}: the prompt has {count} tokens, over the length {length}, and format "
                    f"{config.format} does not truncate; use a length >= {count}"
                )
            text = truncate_middle(tokenizer, context + tail, length)
            if not text.endswith(tail) or len(text) == len(tail):
                raise ValueError(
                    f"{self.where}: the question does not fit in the last {length // 2} tokens kept by the "
                    f"middle truncation to {length} tokens; use a longer length"
                )
            context = text[: len(text) - len(tail)]
        return Sample(
            task=f"{config.label}/{record.subtask}",
            index=index,
            seed=seed,
            context=context,
            question=turn.question,
            answer_prefix=turn.answer_prefix,
            answers=turn.answers,
            metric=config.metric or record.metric,
            max_new_tokens=record.max_new_tokens,
            separator=record.separator,
            chat=record.chat,
            plain_suffix="",
            classes=record.classes,
            suite=FORMATS[config.format].suite,
            tags=dict(record.tags),
        )


def truncate_middle(tokenizer: PreTrainedTokenizerBase, text: str, limit: int) -> str:
    """``text`` cut to its first and last ``limit // 2`` tokens when it has more than ``limit``.

    LongBench's rule (``pred.py``, https://arxiv.org/abs/2308.14508: "truncate in the middle,
    since the left and right side may contain crucial instructions"), which LongBench v2,
    InfiniteBench and LooGLE share: the text is tokenized as the suite does (with the
    tokenizer's special tokens), and both halves are decoded without them. Decoding keeps the
    text's own spaces (``clean_up_tokenization_spaces=False``), so a question in the tail half
    comes back verbatim.
    """
    ids = tokenizer(text.replace(SPLIT, ""))["input_ids"]
    if len(ids) <= limit:
        return text
    half = limit // 2
    options: dict[str, Any] = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
    return tokenizer.decode(ids[:half], **options) + tokenizer.decode(ids[-half:], **options)


_DIGESTS: dict[tuple[str, int, int], str] = {}
_LOADED: dict[tuple[str, str], list[Question]] = {}


def _file_digest(file: Path, size: int, mtime: int) -> str:
    key = (str(file), size, mtime)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(file.read_bytes()).hexdigest()
    return _DIGESTS[key]


def load(config: FileTaskConfig) -> list[Question]:
    """The task's questions: rows read and parsed, sub-tasks filtered, each sub-task's subset
    taken, every turn of every kept row in order. Cached per config and file content.

    Raises:
        ValueError: one line naming the file and line of a bad row, or the task of a bad option
            (no such path, a sub-task no row has, no row at all).
    """
    key = (config.model_dump_json(), config.fingerprint())
    if key not in _LOADED:
        _LOADED[key] = _load(config)
    return _LOADED[key]


def _rows(config: FileTaskConfig) -> list[tuple[SourceRow, str | None]]:
    fmt = FORMATS[config.format]
    if config.hub is not None:
        return [(row, None) for row in read_hub(config.hub, config.configs, config.split, config.data_files)]
    return [(row, fmt.subtask_hint(str(file))) for file in files_of(Path(config.path)) for row in read_file(file)]


def _load(config: FileTaskConfig) -> list[Question]:
    fmt = FORMATS[config.format]
    by_subtask: dict[str, list[tuple[Record, str]]] = {}
    for source_row, hint in _rows(config):
        missing = [f for f in fmt.fields if f not in source_row.row]
        if missing:
            raise ValueError(
                f"{source_row.where}: missing field {missing[0]!r} (a {fmt.name} row has {list(fmt.fields)})"
            )
        try:
            record = fmt.parse(source_row.row, hint)
        except RowError as error:
            raise ValueError(f"{source_row.where}: {error}") from None
        if not config.subtasks or record.subtask in config.subtasks:
            by_subtask.setdefault(record.subtask, []).append((record, source_row.where))
    absent = [s for s in config.subtasks if s not in by_subtask]
    if absent:
        raise ValueError(f"task {config.label}: no row of sub-task {absent[0]!r} in {config.path or config.hub}")
    if not by_subtask:
        raise ValueError(f"task {config.label}: {config.path or config.hub} holds no row")
    questions = []
    for rows in by_subtask.values():
        if config.limit is not None and config.limit < len(rows):
            if config.seed is None:
                rows = rows[: config.limit]
            else:
                picked = sorted(random.Random(config.seed).sample(range(len(rows)), config.limit))
                rows = [rows[i] for i in picked]
        questions += [Question(record, t, where) for record, where in rows for t in range(len(record.turns))]
    return questions


def parse_file_task(spec: Any) -> FileTaskConfig:
    """A file task from a mapping (``name: file`` optional when ``format`` is given)."""
    return FileTaskConfig.model_validate({"name": "file", **dict(spec)})
