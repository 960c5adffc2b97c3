"""Results files that survive interruption: JSON lines, rewritten atomically after each record."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from lorekv.validation import describe


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class ResultsFile:
    """A JSONL file of records keyed by ``key``; finished records are never lost or redone.

    Every :meth:`add` writes the whole file to a temporary sibling, flushes it to disk (fsync)
    and renames it into place, so a reader (or a resumed run) never sees a half-written line
    and a crash loses at most the record being added. The file gets the permissions of the
    process's umask. Temporary siblings left by a killed run are removed when the file is
    opened.

    Args:
        path: the JSONL file (created on the first :meth:`add`).
        key: the field that identifies a record; two records with one key are an error.
        schema: a pydantic model every record must satisfy (checked on reading and adding).

    Raises:
        ValueError: a line that is not JSON, does not fit ``schema`` or repeats a key, with
            the file name and line number; ``path`` is a directory.
    """

    def __init__(self, path: str | Path, key: str = "id", schema: type[BaseModel] | None = None) -> None:
        self.path = Path(path)
        self.key = key
        self.schema = schema
        self.records: list[dict[str, Any]] = []
        self._keys: set[str] = set()
        if self.path.is_dir():
            raise ValueError(f"{self.path}: is a directory, expected a results file (.jsonl)")
        for stale in self.path.parent.glob(f".{self.path.name}-*"):
            stale.unlink(missing_ok=True)
        if self.path.exists():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                if line.strip():
                    self._accept(self._parse(line, number), f"{self.path}:{number}")

    def _parse(self, line: str, number: int) -> dict[str, Any]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.path}:{number} is not valid JSON: {error}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{self.path}:{number} is not a JSON object")
        return record

    def _accept(self, record: dict[str, Any], where: str) -> None:
        if self.key not in record:
            raise ValueError(f"{where}: record has no {self.key!r}")
        if self.schema is not None:
            try:
                self.schema.model_validate(record)
            except ValidationError as error:
                raise ValueError(f"{where}: record does not fit {self.schema.__name__}: {describe(error)}") from None
        key = str(record[self.key])
        if key in self._keys:
            raise ValueError(f"{where}: duplicate {self.key} {key!r} (each record may appear once)")
        self._keys.add(key)
        self.records.append(record)

    def done(self) -> set[str]:
        return set(self._keys)

    def add(self, record: dict[str, Any]) -> None:
        """Append ``record`` (checked like a line read from disk) and rewrite the file atomically."""
        records, keys = list(self.records), set(self._keys)
        self._accept(record, f"{self.path} (new record)")
        try:
            self._write(self.records)
        except BaseException:
            self.records, self._keys = records, keys
            raise

    def _write(self, records: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}-")
        try:
            with os.fdopen(fd, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
