"""Python code blocks of the README and the docs, with the marker that says how each is checked.

A fenced block whose info string is ``python`` (or ``py``) is executed by
``tests/docs/test_code_blocks.py``; an HTML comment on the line just before the fence changes
that (the comment is invisible on the site and on GitHub):

- ``<!-- docs: bundled-model -->``: the block needs the bundled SmolLM2 (``lorekv.load``); its
  page runs in the integration tests (``make test``, CI), not in ``make test-fast``.
- ``<!-- docs: not-run (REASON) -->``: the block cannot run here (a GPU, a model hub); it is
  compiled only, so its syntax is still checked. REASON is required and shown to the reader
  next to the block.

Blocks of one page run in order, in one namespace, in a temporary working directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)(.*)$")
MARKER = re.compile(r"^\s*<!--\s*docs:\s*(.*?)\s*-->\s*$")
NOT_RUN = re.compile(r"^not-run \((.+)\)$")
PYTHON = {"python", "py"}


@dataclass(frozen=True)
class Block:
    """One fenced Python block: where it is, its code, and how it is checked."""

    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    mode: str  # "run", "bundled-model" or "not-run"
    reason: str = ""

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def parse_marker(text: str, where: str) -> tuple[str, str]:
    """``(mode, reason)`` from a marker's text; an unknown marker is an error, not ignored."""
    if text == "bundled-model":
        return "bundled-model", ""
    match = NOT_RUN.match(text)
    if match:
        return "not-run", match.group(1).strip()
    raise ValueError(f"{where}: unknown docs marker {text!r} (bundled-model, or not-run (REASON))")


def extract(path: Path, text: str | None = None) -> list[Block]:
    """The Python blocks of one Markdown file, in order."""
    lines = (path.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.group(1), match.group(2), match.group(3).lower()
        start = i
        i += 1
        body = []
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        if lang not in PYTHON:
            continue
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        where = f"{path}:{start + 1}"
        mode, reason = parse_marker(marker.group(1), where) if marker else ("run", "")
        blocks.append(Block(path, start + 1, "\n".join(body) + "\n", mode, reason))
    return blocks


def pages() -> list[Path]:
    """The README and every Markdown page of the site (generated reports hold no Python)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
