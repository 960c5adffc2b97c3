"""Results files that survive interruption: JSON lines, rewritten atomically after each record."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class ResultsFile:
    """A JSONL file of records keyed by ``key``; finished records are never lost or redone.

    Every :meth:`add` rewrites the whole file to a temporary sibling and renames it into
    place, so a reader (or a resumed run) never sees a half-written line.
    """

    def __init__(self, path: str | Path, key: str = "id") -> None:
        self.path = Path(path)
        self.key = key
        self.records: list[dict[str, Any]] = []
        if self.path.exists():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        self.records.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise ValueError(f"{self.path}:{number} is not valid JSON: {error}") from error

    def done(self) -> set[str]:
        return {str(r[self.key]) for r in self.records}

    def add(self, record: dict[str, Any]) -> None:
        records = [*self.records, record]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}-")
        try:
            with os.fdopen(fd, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.records = records
