"""Count the host synchronisation points a block of code would hit on an accelerator, on the CPU.

On CUDA, a call that hands a tensor's value to Python (``.item()``, ``.tolist()``,
``bool(t)``, ``int(t)``, ``float(t)``, ``t.__index__()``, ``.cpu()``, ``.numpy()``) or whose
output shape depends on the data (``nonzero``, boolean-mask indexing, ``torch.unique``,
``masked_select``, ``repeat_interleave`` with tensor repeats, one-argument ``torch.where``)
waits for every kernel queued before it. So does a blocking copy of host data to the device
(``torch.tensor(data, device=...)``): PyTorch synchronises the stream after a pageable copy.
None of this costs anything visible on the CPU, which is why it is counted here rather than
timed: :class:`SyncCounter` is a ``TorchFunctionMode`` (it sees tensor methods and torch
functions alike) that records each such call with the place it was made from.

The count is an over-estimate in one way: on the CPU every tensor is a host tensor, so a
``.tolist()`` of data that would live on the host anyway (a mask the caller built on the CPU)
counts too. It misses syncs made inside C++ without a Python-visible call, and ``.to(device)``
copies of host tensors (indistinguishable from no-ops when everything is on the CPU).
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import lorekv

PACKAGE = Path(lorekv.__file__).resolve().parent

_VALUE_METHODS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "__format__"}
_DATA_SHAPED = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount"}
_PYTHON_RESULT = {"allclose", "equal", "is_nonzero"}


@dataclass(frozen=True)
class Sync:
    """One sync point: what was called, in which phase, from where.

    Attributes:
        kind: the call, e.g. ``"item"``, ``"__bool__"``, ``"__getitem__[bool]"``, ``"h2d"``.
        phase: the pipeline phase it happened in (see :func:`pipeline_phases`).
        where: ``lorekv/path.py:line`` of the innermost lorekv frame (``"?"`` if none), and
            ``via file:line`` of the frame that made the call when it lies outside lorekv
            (transformers, torch).
    """

    kind: str
    phase: str
    where: str


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", repr(func))


def _is_bool_index(index: Any) -> bool:
    """Whether an index (or any part of a tuple index) is a bool/uint8 tensor (a data-shaped mask)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8) for p in parts)


def _is_scalar_index(index: Any) -> bool:
    """Whether an index holds a 0-d integer tensor, which PyTorch may read on the host to select."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(
        isinstance(p, torch.Tensor) and p.dim() == 0 and not p.is_floating_point() and p.dtype != torch.bool
        for p in parts
    )


def classify(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The kind of sync ``func(*args, **kwargs)`` is, or None if it is not one."""
    name = _name(func)
    if name in _VALUE_METHODS or name in _DATA_SHAPED or name in _PYTHON_RESULT:
        return name
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_") and len(args) > 1:
        if _is_bool_index(args[1]):
            return f"{name}[bool]"
        if _is_scalar_index(args[1]):
            return f"{name}[0-d]"
        return None
    if name == "where" and len(args) + len(kwargs) == 1:
        return "where(condition)"
    if name == "repeat_interleave":
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        if isinstance(repeats, torch.Tensor) and repeats.numel() > 1:
            return "repeat_interleave(tensor)"
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
            return "repeat_interleave(tensor)"
        return None
    if name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
        return "h2d"
    return None


def _where(stack: list[traceback.FrameSummary]) -> str:
    """``lorekv/...:line`` of the innermost lorekv frame, plus ``via`` the calling frame if outside lorekv."""
    ours = None
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(PACKAGE):
            ours = f"lorekv/{path.relative_to(PACKAGE)}:{frame.lineno}"
            break
    caller = stack[-1]
    if Path(caller.filename).resolve().is_relative_to(PACKAGE):
        return ours or "?"
    parts = Path(caller.filename).parts
    short = "/".join(parts[-2:])
    return f"{ours or '?'} via {short}:{caller.lineno}"


class SyncCounter(TorchFunctionMode):
    """Records every sync point (:func:`classify`) made while it is active, with its phase and place.

    Use as a context manager; :attr:`phase` names the phase new records go to (set by
    :func:`pipeline_phases`, ``"other"`` otherwise).
    """

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[Sync] = []
        self.phase = "other"

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        kind = classify(func, args, kwargs)
        if kind is not None:
            stack = traceback.extract_stack(sys._getframe(1))
            self.syncs.append(Sync(kind, self.phase, _where(stack)))
        return func(*args, **kwargs)

    def per_phase(self) -> dict[str, int]:
        """Number of syncs in each phase."""
        return dict(Counter(s.phase for s in self.syncs))

    def places(self, phase: str | None = None) -> Counter[tuple[str, str]]:
        """(kind, where) -> count, for one phase or all of them."""
        return Counter((s.kind, s.where) for s in self.syncs if phase is None or s.phase == phase)

    def report(self) -> str:
        """A readable list: per phase, each place with its kind and count, most frequent first."""
        lines = []
        for phase in dict.fromkeys(s.phase for s in self.syncs):
            lines.append(f"{phase}: {self.per_phase()[phase]}")
            for (kind, where), count in self.places(phase).most_common():
                lines.append(f"  {count:4d} x {kind:24s} {where}")
        return "\n".join(lines) or "no syncs"


@contextmanager
def pipeline_phases(counter: SyncCounter) -> Iterator[SyncCounter]:
    """Attribute ``counter``'s records to the pipeline's timed phases (prefill, sampling, scoring,
    selection); what runs before the first phase is ``"input"`` (validation), after the last
    ``"stats"``."""
    from lorekv.hf.timing import PhaseTimer

    original = PhaseTimer.phase

    @contextmanager
    def phase(self: PhaseTimer, name: str) -> Iterator[None]:
        counter.phase = name
        with original(self, name):
            yield
        counter.phase = "stats"

    counter.phase = "input"
    PhaseTimer.phase = phase  # type: ignore[method-assign]
    try:
        with counter:
            yield counter
    finally:
        PhaseTimer.phase = original  # type: ignore[method-assign]
        counter.phase = "other"
