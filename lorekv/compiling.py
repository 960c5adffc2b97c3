"""``torch.compile`` for lorekv's kernels, behind an option.

Kernels are compiled once per function with dynamic shapes (``dynamic=True``), so prompts of
other lengths, other layers and other chunk sizes reuse the first compilation instead of
paying it again. Compiled kernels compute the same formulas as eager ones (tested to float
rounding); the first call pays the compilation (tens of seconds on a small CPU), which
``lorekv bench`` reports apart from the steady-state time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)


@functools.cache
def compiled(fn: F) -> F:
    """``fn`` compiled by ``torch.compile`` with dynamic shapes (one compiled wrapper per function)."""
    return torch.compile(fn, dynamic=True)  # type: ignore[return-value]
