"""Markdown tables, as the report and the suites' tables write them."""

from __future__ import annotations

from collections.abc import Sequence


def md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table (first column left-aligned, the others right-aligned)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines
