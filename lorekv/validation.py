"""Argument checks that fail early with the parameter's name and allowed range."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import ValidationError


def check_int_at_least(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_in_range(
    name: str, value: float, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> float:
    lo_ok = value > low if low_open else value >= low
    hi_ok = value < high if high_open else value <= high
    if not (lo_ok and hi_ok):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return value


def check_shape(name: str, tensor: torch.Tensor, expected: Sequence[int | None]) -> None:
    """``expected`` lists the sizes; ``None`` accepts any size in that dimension."""
    ok = tensor.dim() == len(expected) and all(e is None or s == e for s, e in zip(tensor.shape, expected, strict=True))
    if not ok:
        shown = tuple("*" if e is None else e for e in expected)
        raise ValueError(f"{name} must have shape {shown}, got {tuple(tensor.shape)}")


def describe(error: ValidationError) -> str:
    """A pydantic validation error on one line: ``field.path: message (got value); ...``."""
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "value"
        got = f" (got {item['input']!r})" if "input" in item and not isinstance(item["input"], dict) else ""
        parts.append(f"{where}: {item['msg']}{got}")
    return "; ".join(parts)
