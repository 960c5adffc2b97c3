"""Reading a benchmark's rows from a local file, a folder of files, or a hub dataset, each row
with where it came from (``file:line``) so that every error can name it."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".json")
"""The file types a folder is searched for (recursively: RULER writes ``<task>/validation.jsonl``)."""


@dataclass(frozen=True)
class SourceRow:
    """One row of a benchmark with its origin.

    Attributes:
        source: the file (or ``hub-name[config]``) the row comes from.
        where: ``source:line`` (``source:item N`` in a JSON list, ``source row N`` from a hub).
        row: the row's fields.
    """

    source: str
    where: str
    row: Mapping[str, Any]


def files_of(path: Path) -> list[Path]:
    """``path`` itself, or the ``.jsonl``/``.json`` files under the folder ``path``, sorted.

    Raises:
        ValueError: a path that does not exist, a file of another type, a folder without any.
    """
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise ValueError(f"{path}: not a .jsonl or .json file")
        return [path]
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not found:
        raise ValueError(f"{path}: the folder holds no .jsonl or .json file")
    return found


def read_file(path: Path) -> Iterator[SourceRow]:
    """The rows of one JSONL file (one object a line, blank lines skipped) or JSON file (a list
    of objects, or an object with a ``data`` list).

    Raises:
        ValueError: ``file:line`` and what is wrong: not JSON, not an object.
    """
    source = str(path)
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{source}:{number}: not valid JSON ({error.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{source}:{number}: a row must be a JSON object, got {type(row).__name__}")
                yield SourceRow(source, f"{source}:{number}", row)
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}:{error.lineno}: not valid JSON ({error.msg})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise ValueError(f"{source}: a .json file must hold a list of rows (or an object with a 'data' list)")
    for number, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{source}:item {number}: a row must be a JSON object, got {type(row).__name__}")
        yield SourceRow(source, f"{source}:item {number}", row)


def read_hub(name: str, configs: list[str], split: str, data_files: str | None) -> Iterator[SourceRow]:
    """The rows of a dataset through ``datasets.load_dataset`` (a hub name, or a builder such
    as ``json`` with ``data_files``), one config after the other (``[None]``: the default)."""
    from lorekv.extras import require

    datasets = require("datasets", extra="hub", what="benchmark datasets from a hub")
    for config in configs or [None]:
        source = name if config is None else f"{name}[{config}]"
        try:
            data = datasets.load_dataset(name, config, split=split, data_files=data_files)
        except Exception as error:  # noqa: BLE001  (datasets raises many types; the message is what matters)
            raise ValueError(f"{source}: cannot load split {split!r}: {error}") from None
        for number, row in enumerate(data, 1):
            yield SourceRow(source, f"{source} row {number}", dict(row))
