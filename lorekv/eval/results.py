"""Results files that survive interruption (JSON lines, each record appended whole and flushed to
disk) and the compact encoding of a row's kept-token map."""

from __future__ import annotations

import base64
import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from lorekv.runfiles import atomic_write_text
from lorekv.tensorfiles import fsync_directory
from lorekv.validation import describe


class ResultsFile:
    """A JSONL file of records keyed by ``key``; finished records are never lost or redone.

    Every :meth:`add` appends one complete line with a single write and flushes it to disk
    (fsync) before returning, so a crash loses at most the record being added; the file is
    never rewritten, so adding costs the same at row 10 and row 100,000. A line torn by a
    crash mid-write (power loss; a killed process cannot tear a single write) can only be
    the last one: it has no newline, and opening the file drops it with a warning (rewriting
    the rest atomically). A new file gets the permissions of the process's umask. Temporary
    siblings left by a killed repair are removed when the file is opened.

    Args:
        path: the JSONL file (created on the first :meth:`add`, or at once with ``header``).
        key: the field that identifies a record; two records with one key are an error.
        schema: a pydantic model every record must satisfy (checked on reading and adding).
        header: a run header (a mapping with ``"type": "header"``) that must be the file's
            first line: written when the file is new; when it exists, its header's
            ``header_key`` field must equal this one's (a file of another run is refused).
        header_key: the header field that identifies a run (e.g. the grid's digest).
        writable: False to only read (a report, a merge): the file is never changed, a torn
            last line is skipped rather than repaired, temporaries are left alone, and
            :meth:`add` is refused. A reader may then run while a writer appends.

    Raises:
        ValueError: a line that is not JSON, does not fit ``schema`` or repeats a key, with
            the file name and line number; ``path`` is a directory; a header mismatch.
    """

    def __init__(
        self,
        path: str | Path,
        key: str = "id",
        schema: type[BaseModel] | None = None,
        *,
        header: dict[str, Any] | None = None,
        header_key: str = "grid",
        writable: bool = True,
    ) -> None:
        self.path = Path(path)
        self.key = key
        self.schema = schema
        self.records: list[dict[str, Any]] = []
        self.header: dict[str, Any] | None = None
        self._keys: set[str] = set()
        self.writable = writable
        if self.path.is_dir():
            raise ValueError(f"{self.path}: is a directory, expected a results file (.jsonl)")
        if writable:
            for stale in self.path.parent.glob(f".{self.path.name}-*"):
                stale.unlink(missing_ok=True)
        if self.path.exists():
            self._read()
        if header is not None and not writable:
            raise ValueError("header: only a writable results file takes a header to write")
        if header is not None:
            if header.get("type") != "header":
                raise ValueError('header must be a mapping with "type": "header"')
            if self.header is None and self.records:
                raise ValueError(f"{self.path}: holds records but no run header; write to a new file")
            if self.header is None:
                self._append([header])
                self.header = dict(header)
            elif self.header.get(header_key) != header.get(header_key):
                raise ValueError(
                    f"{self.path}: holds results of another run ({header_key} {self.header.get(header_key)!r}, "
                    f"this one is {header.get(header_key)!r}); write to a new file"
                )

    def _read(self) -> None:
        text = self.path.read_text()
        if text and not text.endswith("\n"):
            complete = text[: text.rfind("\n") + 1]
            if self.writable:
                warnings.warn(
                    f"{self.path}: dropped a torn last line (a crash mid-write): {text[len(complete) :][:60]!r}",
                    stacklevel=3,
                )
                self._replace(complete)
            text = complete  # a reader skips a line being written
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            record = self._parse(line, number)
            if record.get("type") == "header":
                if number != 1:
                    raise ValueError(f"{self.path}:{number}: a run header may only be the first line")
                self.header = record
            else:
                self._accept(record, f"{self.path}:{number}")

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
        """Append ``record`` (checked like a line read from disk) and flush it to disk."""
        if not self.writable:
            raise ValueError(f"{self.path}: opened read-only")
        line = json.dumps(record)  # a record that cannot be written fails before anything changes
        records, keys = list(self.records), set(self._keys)
        self._accept(record, f"{self.path} (new record)")
        try:
            self._append([record], [line])
        except BaseException:
            self.records, self._keys = records, keys
            raise

    def _append(self, records: list[dict[str, Any]], lines: list[str] | None = None) -> None:
        data = "".join(line + "\n" for line in (lines or [json.dumps(r) for r in records])).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write (disk full): undo it, so no torn line stays
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes (disk full?)")
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_directory(self.path.parent)

    def _replace(self, text: str) -> None:
        atomic_write_text(self.path, text)


def encode_keep_map(mask: Any, layers: Sequence[int]) -> dict[str, Any]:
    """The ``keep_map`` field of a result row for a boolean mask (L, H, n); True = kept.

    ``bits`` is base64 of ``numpy.packbits`` of the mask flattened in C order: 1 bit per entry,
    so a 24-layer, 8-head, 32k-token map is 786 KB raw, ~1 MB as text. ``layers`` names the
    model layer of each of the L rows (layers without a cache, or not compressed, may be absent).
    """
    array = np.asarray(mask)
    if array.ndim != 3:
        raise ValueError(f"mask must have shape (layers, heads, positions), got shape {array.shape}")
    if array.dtype != np.bool_:
        raise ValueError(f"mask must be boolean, got dtype {array.dtype}")
    layers = [int(layer) for layer in layers]
    if len(layers) != array.shape[0]:
        raise ValueError(f"layers must name each of the mask's {array.shape[0]} layers, got {len(layers)}")
    bits = base64.b64encode(np.packbits(array.ravel(order="C")).tobytes()).decode("ascii")
    return {"layers": layers, "shape": [int(s) for s in array.shape], "bits": bits}


def decode_keep_map(field: Mapping[str, Any]) -> tuple[list[int], np.ndarray]:
    """(layers, mask (L, H, n) bool) of a row's ``keep_map`` field: the inverse of :func:`encode_keep_map`."""
    try:
        layers, shape, bits = list(field["layers"]), [int(s) for s in field["shape"]], field["bits"]
    except (KeyError, TypeError) as error:
        raise ValueError(f"keep_map must hold layers, shape and bits, got {field!r:.200}") from error
    if len(shape) != 3 or len(layers) != shape[0]:
        raise ValueError(
            f"keep_map: shape must be [L, H, n] with L = len(layers), got {shape} for {len(layers)} layers"
        )
    packed = np.frombuffer(base64.b64decode(bits), dtype=np.uint8)
    count = math.prod(shape)
    if packed.size != (count + 7) // 8:
        raise ValueError(f"keep_map: bits hold {packed.size} bytes, shape {shape} needs {(count + 7) // 8}")
    mask = np.unpackbits(packed)[:count].reshape(shape).astype(bool)
    return layers, mask
