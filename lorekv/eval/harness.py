"""Running a grid: resumable, sharded, one results row per (sample, cell), with a run header.

``run_grid`` walks the grid's units (model, mode, length, task, sample) in a fixed order,
takes every N-th one when sharded, and writes each cell's row the moment it is decoded
(:class:`ResultsFile` appends and fsyncs), so an interrupted run resumes where it stopped
and redoes no finished cell. Up to ``grid.batch_size`` units run as one batch
(:func:`lorekv.eval.shared.run_units`), their rows those of batch size 1. ``merge`` joins
the shards of one grid into one file and refuses shards of different grids. The first line
of every results file is the run header: the grid and its digest, lorekv's version and
commit, package versions, machine, threads, device and seeds, what a leaderboard needs to be
reproduced.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from lorekv.eval.grid import GridConfig, Unit, units
from lorekv.eval.results import ResultsFile
from lorekv.eval.shared import Cell, run_units
from lorekv.eval.suites.task import FileTaskConfig
from lorekv.runfiles import atomic_write_text, git_commit, machine, package_version, package_versions

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from lorekv.eval.tasks import Sample


class EvalRow(BaseModel):
    """One answered sample in one (method, budget) cell: the schema of a grid's results rows."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["row"]
    id: str
    model: str
    task: str
    length: int
    mode: Literal["query_aware", "query_agnostic", "decoding"]
    index: int
    seed: int
    sampler_seed: int | None = None
    method: str
    group: str | None
    budget_label: str
    budget: int | None
    ratio: float | None
    tokens: int
    prediction: str
    answers: list[str]
    metric: str
    score: float
    kept: float
    candidates: int
    kv_bytes_before: int
    kv_bytes_after: int
    seconds: dict[str, float]
    compression_seconds: float
    keep_map: dict[str, Any] | None
    gold_positions: list[int] | None
    suite: str | None = None
    tags: dict[str, str] | None = None
    futures: int | None = None


def results_file(path: str | Path, header: dict[str, Any] | None = None, *, writable: bool = True) -> ResultsFile:
    """A grid's results file at ``path``, rows checked against :class:`EvalRow`."""
    return ResultsFile(path, schema=EvalRow, header=header, writable=writable)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s ``.lock`` sibling: a second writer of one results
    file (a relaunched job, a forgotten ``--shard``) fails at once instead of doubling rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"out: {path} is being written by another process") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def parse_shard(text: str | None, environ: dict[str, str] | None = None) -> tuple[int, int]:
    """(i, N) from ``--shard i/N`` (0 <= i < N), else from ``RANK``/``WORLD_SIZE`` (set by
    ``torchrun`` and ``accelerate launch``), else (0, 1)."""
    environ = dict(os.environ if environ is None else environ)
    if text is None:
        if "RANK" in environ and "WORLD_SIZE" in environ:
            text = f"{environ['RANK']}/{environ['WORLD_SIZE']}"
        else:
            return 0, 1
    index, slash, count = text.partition("/")
    if not slash or not index.isdigit() or not count.isdigit() or not 0 <= int(index) < int(count):
        raise ValueError(f"shard must be i/N with 0 <= i < N (e.g. 0/2), got {text!r}")
    return int(index), int(count)


def shard_path(out: Path, shard: tuple[int, int]) -> Path:
    """The results file of ``shard`` (``out`` itself when not sharded)."""
    index, count = shard
    return out if count == 1 else out.with_name(f"{out.stem}.shard{index}of{count}{out.suffix or '.jsonl'}")


def run_header(grid: GridConfig, shard: tuple[int, int]) -> dict[str, Any]:
    """The first line of a results file: what produced it, and on what."""
    return {
        "type": "header",
        "grid": grid.digest,
        "grid_config": grid.model_dump(mode="json"),
        "pipelines": grid.pipelines(),
        "lorekv": package_version("lorekv"),
        "commit": git_commit(),
        "packages": package_versions(),
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "device": grid.device_map or process_device(grid.device),
        "dtype": grid.dtype,
        "seed": grid.seed,
        **({"files": grid.fingerprints()} if grid.file_tasks else {}),
        "shard": list(shard),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def check_resumable(path: Path, header: Mapping[str, Any]) -> None:
    """Refuse, saying why, to resume a results file of this grid whose methods resolved to other
    pipelines: a preset's default or a pipeline file changed since it was written, or it predates
    the header's ``pipelines`` so that what its methods were cannot be checked.
    (A file of another grid altogether is refused by :class:`ResultsFile`.)"""
    if not path.is_file():
        return
    with path.open() as file:
        first = file.readline()
    try:
        written = json.loads(first)
    except json.JSONDecodeError:
        return
    if not isinstance(written, dict) or written.get("type") != "header" or written.get("grid") == header["grid"]:
        return
    by = f"lorekv {written.get('lorekv')} (commit {written.get('commit')})"
    if "pipelines" not in written:
        raise ValueError(
            f"{path}: written by {by} before results files recorded the pipelines their methods resolve to, "
            "so whether its rows are this grid's cannot be checked (a preset's defaults may have changed "
            "since); finish it with that commit, or write to a new file"
        )
    was, now = written["pipelines"], header["pipelines"]
    changed = [
        f"{cell} {field}: {before!r} -> {after!r}"
        for cell in sorted(was.keys() & now.keys())
        for field, before, after in differences(was[cell], now[cell])
    ]
    if changed:
        raise ValueError(
            f"{path}: written by {by}, whose methods resolved to other pipelines than they do now "
            f"({'; '.join(changed[:3])}{'; ...' if len(changed) > 3 else ''}); a preset's default or a "
            "pipeline file changed. Finish it with that commit, pin the old values in the grid (the "
            "method's options or set), or write to a new file"
        )


def differences(was: Any, now: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The dotted fields where two JSON values differ, with the value on each side."""
    if isinstance(was, dict) and isinstance(now, dict):
        return [
            found
            for key in sorted(was.keys() | now.keys())
            for found in differences(was.get(key), now.get(key), f"{prefix}{key}.")
        ]
    return [] if was == now else [(prefix.rstrip("."), was, now)]


def grid_cells(grid: GridConfig) -> list[Cell]:
    """Every (method, budget, sampler seed) column of the grid, methods in the grid's order."""
    return [
        Cell(method, budget, seed)
        for method in grid.methods
        for budget in grid.budgets_of(method)
        for seed in method.seeds or [None]
    ]


def shard_units(grid: GridConfig, shard: tuple[int, int]) -> list[Unit]:
    """This shard's units: unit k of the grid's fixed (sample-major) order goes to shard
    (k + k // T) mod N, T the number of tasks, so that each shard gets about as many samples of
    every task even when N divides T."""
    index, count = shard
    tasks = len(grid.tasks)
    return [u for k, u in enumerate(units(grid)) if (k + k // tasks) % count == index]


Loader = Callable[[str, GridConfig], "tuple[PreTrainedModel, PreTrainedTokenizerBase]"]


def load_model(name: str, grid: GridConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The grid's model ``name`` in its dtype, on its device (or placed by ``device_map``)."""
    from lorekv.models import load

    dtype = getattr(torch, grid.dtype)
    model, tokenizer = load(name, dtype, device_map=grid.device_map)
    if grid.device_map is None:
        model.to(process_device(grid.device))
    return model, tokenizer


def process_device(device: str, environ: dict[str, str] | None = None) -> str:
    """``device``, with a bare ``cuda`` taken to mean this process's GPU under ``torchrun`` /
    ``accelerate launch`` (``cuda:$LOCAL_RANK``), so that shards do not share one GPU."""
    environ = dict(os.environ if environ is None else environ)
    if device == "cuda" and "LOCAL_RANK" in environ:
        return f"cuda:{int(environ['LOCAL_RANK'])}"
    return device


def run_grid(
    grid: GridConfig,
    out: str | Path,
    *,
    shard: tuple[int, int] = (0, 1),
    base: Path | None = None,
    loader: Loader = load_model,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Run this shard's part of ``grid`` into its results file; returns the file's path.

    Cells already in the file are skipped, so a second call resumes an interrupted run (at any
    ``batch_size``: units are batched by the cells they have left).
    ``base``: where pipeline files named in the grid are looked up (the grid file's folder).
    """
    grid.check(base)
    grid = grid.resolved(base)
    path = shard_path(Path(out), shard)
    with exclusive(path):
        _run_shard(grid, path, shard, base, loader, progress, on_row)
    return path


def _run_shard(
    grid: GridConfig,
    path: Path,
    shard: tuple[int, int],
    base: Path | None,
    loader: Loader,
    progress: bool,
    on_row: Callable[[dict[str, Any]], None] | None,
) -> None:
    header = run_header(grid, shard)
    check_resumable(path, header)
    results = results_file(path, header=header)
    cells = grid_cells(grid)
    mine = shard_units(grid, shard)
    done = results.done()
    total = len(mine) * len(cells)
    finished = sum(c.key(u) in done for u in mine for c in cells)
    bar = _progress(total, finished, progress)
    loaded: dict[str, tuple[PreTrainedModel, PreTrainedTokenizerBase]] = {}

    def emit(row: dict[str, Any]) -> None:
        results.add(row)
        bar.update(1)
        if on_row is not None:
            on_row(row)

    # Units are batched when they can share one prefill and one generate call per cell: the same
    # model, mode and length (units come in that order, so a batch waits for no later stage),
    # the same max_new_tokens and the same unfinished cells. A batch holds up to batch_size
    # contexts: the questions of one benchmark row come one after the other and join their
    # context's batch (query-agnostic, run_units compresses a context once for them all).
    # Resuming needs nothing more: a unit whose batch was cut short by a crash has fewer cells
    # left, and batches with the units left exactly as it.
    pending: dict[tuple[tuple[int, ...], int], list[tuple[Unit, Sample]]] = {}
    stage: tuple[str, str, int] | None = None
    checked: dict[str, Sample] = {}

    def run(key: tuple[tuple[int, ...], int]) -> None:
        batch = pending.pop(key)
        model, tokenizer = loaded[batch[0][0].model]
        first = batch[0][0]
        bar.set_postfix_str(f"{first.task.label} #{first.index}" + (f" +{len(batch) - 1}" if len(batch) > 1 else ""))
        run_units(
            model,
            tokenizer,
            [u for u, _ in batch],
            [s for _, s in batch],
            [cells[k] for k in key[0]],
            emit,
            keep_maps=[u.index < grid.keep_maps for u, _ in batch],
            base=base,
        )

    try:
        for unit in mine:
            todo = tuple(k for k, c in enumerate(cells) if c.key(unit) not in done)
            if not todo:
                continue
            if (unit.model, unit.mode, unit.length) != stage:
                for key in list(pending):
                    run(key)
                stage = (unit.model, unit.mode, unit.length)
            if unit.model not in loaded:
                loaded.clear()  # the previous model is freed before the next one loads
                loaded[unit.model] = loader(unit.model, grid)
                checked = check_file_samples(grid, mine, unit.model, loaded[unit.model][1], done, cells)
            sample = checked.pop(unit.key, None) or unit.sample(loaded[unit.model][1], grid.seed)
            key = (todo, sample.max_new_tokens)
            contexts = {s.context for _, s in pending.get(key, [])}
            if sample.context not in contexts and len(contexts) == grid.batch_size:
                run(key)
            pending.setdefault(key, []).append((unit, sample))
        for key in list(pending):
            run(key)
    finally:
        bar.close()


def check_file_samples(
    grid: GridConfig, mine: Sequence[Unit], model: str, tokenizer: Any, done: set[str], cells: Sequence[Cell]
) -> dict[str, Sample]:
    """The samples of this shard's unfinished benchmark-file units on ``model``, built before
    any model work, so that a prompt that does not fit even after truncation fails at once
    (naming its file and line) rather than after hours of other cells."""
    out = {}
    for unit in mine:
        if unit.model == model and isinstance(unit.task, FileTaskConfig):
            if any(c.key(unit) not in done for c in cells):
                out[unit.key] = unit.sample(tokenizer, grid.seed)
    return out


def _progress(total: int, initial: int, enabled: bool) -> Any:
    from lorekv.extras import require

    tqdm = require("tqdm.auto", extra="eval", what="eval progress bar").tqdm

    interactive = sys.stderr.isatty()
    return tqdm(
        total=total, initial=initial, unit="cell", disable=not enabled, mininterval=0.5 if interactive else 30.0,
        dynamic_ncols=True, desc="eval",
    )  # fmt: skip


def merge(out: str | Path, shards: Sequence[str | Path], *, allow_missing: bool = False) -> tuple[int, list[str]]:
    """Join the shard files of one grid into ``out`` (written atomically); returns the row
    count and the cells still missing (an error unless ``allow_missing``).

    Raises:
        ValueError: a shard without a header, shards of different grids, a row in two shards,
            ``out`` among the shards, or missing cells.
    """
    out = Path(out)
    paths = [Path(p) for p in shards]
    if not paths:
        raise ValueError("shards: name at least one shard file to merge")
    if out.resolve() in {p.resolve() for p in paths}:
        raise ValueError(f"out: {out} is one of the shards; merge into a new file")
    if out.exists():
        raise ValueError(f"out: {out} exists; merge into a new file (a merge never overwrites results)")
    files = []
    for p in paths:
        if not p.is_file():
            raise ValueError(f"shard {p}: no such file")
        f = results_file(p, writable=False)
        if f.header is None:
            raise ValueError(f"shard {p}: has no run header (not written by `lorekv eval`)")
        files.append(f)
    digests = {f.header["grid"] for f in files}
    if len(digests) != 1:
        found = ", ".join(f"{p}: {f.header['grid']}" for p, f in zip(paths, files, strict=True))
        raise ValueError(f"shards of different grids cannot be merged ({found})")
    grid = GridConfig.model_validate(files[0].header["grid_config"])
    rows: dict[str, dict[str, Any]] = {}
    for p, f in zip(paths, files, strict=True):
        for row in f.records:
            if row["id"] in rows:
                raise ValueError(f"shard {p}: row {row['id']!r} is also in another shard")
            rows[row["id"]] = row
    expected = [c.key(u) for u in units(grid) for c in grid_cells(grid)]
    missing = [k for k in expected if k not in rows]
    if missing and not allow_missing:
        raise ValueError(
            f"{len(missing)} of {len(expected)} cells are missing (first: {missing[0]}); "
            "finish or resume the shards, or pass --allow-missing"
        )
    sources = [_shard_summary(p, f.header) for p, f in zip(paths, files, strict=True)]
    header = {**files[0].header, "shard": [0, 1], "merged_from": sources}
    ordered = [rows[k] for k in expected if k in rows]
    atomic_write_text(out, _jsonl([header, *ordered]))
    return len(ordered), missing


def _shard_summary(path: Path, header: dict[str, Any]) -> dict[str, Any]:
    keys = ("shard", "commit", "machine", "threads", "device", "started")
    return {"file": path.name, **{k: header.get(k) for k in keys}}


def _jsonl(records: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def read_results(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, headers) of one or more results files, rows checked against :class:`EvalRow`."""
    rows, headers = [], []
    for p in paths:
        f = results_file(p, writable=False)
        rows.extend(f.records)
        if f.header is not None:
            headers.append(f.header)
    return rows, headers
