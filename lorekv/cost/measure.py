"""Measuring instruments: repeated timings with their medians, differenced decode timings,
a peak-memory meter of torch's own allocations, the fitted growth exponent, and a count of the
operators that would launch a kernel on a device.

Every timing keeps its raw runs: the warm-up call (``first``, which pays any compilation)
and the ``repeats`` timed calls after it, whose median is the figure reported.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Clock = Callable[[], float]


@dataclass
class Timed:
    """Seconds of one measurement: the warm-up call, then the timed runs.

    Attributes:
        first: the first call (warm-up; includes compilation, caches filling).
        runs: the ``repeats`` calls after it.
        phases: per run, its phases' seconds (compressions), else None.
    """

    first: float
    runs: list[float]
    phases: list[dict[str, float]] | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def overhead(self) -> float:
        """First call minus the median of the later ones: the one-off cost (compilation) of the first call."""
        return self.first - self.median

    def phase_medians(self) -> dict[str, float]:
        """The median of each phase over the runs (empty without phases)."""
        if not self.phases:
            return {}
        return {name: statistics.median(run[name] for run in self.phases) for name in self.phases[0]}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"first": self.first, "runs": list(self.runs), "median": self.median}
        if self.phases is not None:
            out["phases"] = [dict(p) for p in self.phases]
            out["phase_medians"] = self.phase_medians()
        return out


def clocked(fn: Callable[[], Any], clock: Clock) -> Callable[[], float]:
    """``fn`` turned into a call that returns its own seconds on ``clock``."""

    def run() -> float:
        start = clock()
        fn()
        return clock() - start

    return run


def repeat(
    fn: Callable[[], Any],
    repeats: int,
    clock: Clock,
    *,
    phases: Callable[[Any], Mapping[str, float]] | None = None,
) -> Timed:
    """Call ``fn`` once to warm up, then ``repeats`` times, timing each call on ``clock``.

    ``phases``: maps ``fn``'s result to its own per-phase seconds (e.g. a compression's
    ``stats.seconds``), kept per timed run beside the clock's total.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")

    def once() -> tuple[float, Any]:
        start = clock()
        result = fn()
        return clock() - start, result

    first, _ = once()
    runs, parts = [], []
    for _ in range(repeats):
        seconds, result = once()
        runs.append(seconds)
        if phases is not None:
            parts.append({k: float(v) for k, v in phases(result).items()})
        del result
    return Timed(first, runs, parts if phases is not None else None)


def repeat_seconds(fn: Callable[[], float], repeats: int) -> Timed:
    """As :func:`repeat` for a ``fn`` that returns its own seconds (e.g. transformers' prefill timer)."""
    if repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    first = fn()
    return Timed(first, [fn() for _ in range(repeats)])


@dataclass
class PerToken:
    """Decoding time per token by differencing: (t_K - t_1) / (K - 1) per repeat, so that
    feeding the prompt's last token and the call's fixed costs cancel.

    Attributes:
        tokens: K.
        long: the runs decoding K tokens.
        short: the runs decoding 1 token (paired with ``long`` run by run).
    """

    tokens: int
    long: Timed
    short: Timed
    per_token: list[float] = field(init=False)

    def __post_init__(self) -> None:
        k = self.tokens
        self.per_token = [(a - b) / (k - 1) for a, b in zip(self.long.runs, self.short.runs, strict=True)]

    @property
    def median(self) -> float:
        """Median seconds per decoded token."""
        return statistics.median(self.per_token)

    @property
    def tokens_per_second(self) -> float | None:
        """1 / the median per-token time; None when that is not positive (K too small to rise above the noise)."""
        return 1.0 / self.median if self.median > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "long": self.long.to_dict(),
            "short": self.short.to_dict(),
            "per_token": list(self.per_token),
            "median_per_token": self.median,
            "tokens_per_second": self.tokens_per_second,
        }


def per_token(decode: Callable[[int], Any], tokens: int, repeats: int, clock: Clock) -> PerToken:
    """Time ``decode(k)`` for k = 1 and k = ``tokens``, interleaved (one warm-up of each)."""
    if tokens < 2:
        raise ValueError(f"decode_tokens must be an integer >= 2 (per-token time is a difference), got {tokens!r}")
    one, many = clocked(lambda: decode(1), clock), clocked(lambda: decode(tokens), clock)
    pairs = [(one(), many()) for _ in range(repeats + 1)]
    short = Timed(pairs[0][0], [p[0] for p in pairs[1:]])
    long = Timed(pairs[0][1], [p[1] for p in pairs[1:]])
    return PerToken(tokens, long, short)


def fit_exponent(sizes: Sequence[float], seconds: Sequence[float]) -> float | None:
    """k of seconds ~ c * size^k, least squares on (log size, log seconds); None when it is not
    determined (fewer than two distinct sizes, or a time that is not positive)."""
    if len(sizes) != len(seconds):
        raise ValueError(f"sizes and seconds must have the same length, got {len(sizes)} and {len(seconds)}")
    if len(set(sizes)) < 2 or any(s <= 0 for s in sizes) or any(t <= 0 for t in seconds):
        return None
    xs = [math.log(s) for s in sizes]
    ys = [math.log(t) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


# The profiler's own chatter on stderr (kineto start/stop lines, the allocator's note about
# blocks freed that were allocated before profiling began): dropped, everything else replayed.
_PROFILER_NOISE = re.compile(
    r"SyncActivityProfilerHandler|profiler_(start|stop)|allocated before the profiling started"
)


class PeakMemory:
    """Peak bytes torch allocates above the level at entry, on ``device``.

    CUDA: ``torch.cuda.reset_peak_memory_stats`` and ``max_memory_allocated`` minus the
    bytes allocated at entry. CPU: torch keeps no CPU allocation statistics, so the block runs
    under ``torch.profiler`` with ``profile_memory=True``; its memory events (every allocation
    and free of torch's CPU allocator, with its size and time) are summed in time order and the
    running maximum is the peak. Only the block's own allocations and their frees count: a free
    of memory allocated before the block (e.g. a cache dropped inside it) is left out (the
    allocator reports it with no size, or a stale one), so the CPU peak never goes below what
    was allocated inside the block: an upper bound when the block frees older tensors, exact
    otherwise. Memory the allocator does not serve (e.g. oneDNN scratch, Python objects) is
    not seen; RSS is not used since glibc keeps freed memory mapped.

    Use as a context manager; ``peak`` (bytes >= 0) and ``retained`` (bytes still allocated at
    exit, of those allocated inside) are set on exit.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.peak: int = 0
        self.retained: int = 0
        self._profiler: Any = None
        self._quiet: contextlib.ExitStack | None = None
        self._base = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._quiet = contextlib.ExitStack()
            self._quiet.enter_context(_quiet_stderr())  # the profiler's chatter, during the block too
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = max(torch.cuda.max_memory_allocated(self.device) - self._base, 0)
            self.retained = torch.cuda.memory_allocated(self.device) - self._base
            return
        try:
            self._profiler.__exit__(*exc)
        finally:
            assert self._quiet is not None
            self._quiet.close()
        if exc[0] is None:
            self.peak, self.retained = peak_of(_memory_events(self._profiler))
        self._profiler = None


def _memory_events(profiler: Any) -> list[tuple[int, int]]:
    """(time in ns, bytes) of the profiled block's own CPU allocations and frees (:func:`own_events`)."""
    from torch._C._profiler import _EventType

    return own_events(
        (event.start_time_ns, event.extra_fields.ptr, int(event.extra_fields.alloc_size))
        for event in _walk(profiler.profiler.kineto_results.experimental_event_tree())
        if event.typed[0] == _EventType.Allocation and event.extra_fields.device.type == "cpu"
    )


def own_events(events: Iterable[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """(time, bytes: + allocated, - freed) in time order, from allocator events (time, address,
    bytes), keeping every allocation and only the frees of addresses allocated among them.

    A free at another address is left out: the allocator reports it with whatever size it last
    recorded there, which is stale when the memory there was allocated while profiling and freed
    after (an earlier block's tensor), so a block that frees an older tensor would otherwise
    count a phantom free of another size.
    """
    live: set[int] = set()
    found = []
    for time, address, nbytes in sorted(events, key=lambda event: event[0]):
        if nbytes > 0:
            live.add(address)
        elif address in live:
            live.discard(address)
        else:
            continue
        found.append((time, nbytes))
    return found


def _walk(nodes: Sequence[Any]) -> Iterator[Any]:
    """Every node of the profiler's event tree, depth first."""
    for node in nodes:
        yield node
        yield from _walk(node.children)


def peak_of(events: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(peak, final) of the running sum of byte changes taken in order; the peak is >= 0."""
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak, level


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Capture file descriptor 2 (where the profiler's C++ side writes) and replay every line
    that is not the profiler's own chatter."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (e.g. captured by a test runner)
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines = sink.read().decode(errors="replace").splitlines()
            kept = [line for line in lines if not _PROFILER_NOISE.search(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


NO_KERNEL = frozenset(
    "aten::" + name
    for name in (
        "as_strided as_strided_ view reshape _reshape_alias _unsafe_view slice select narrow transpose t permute "
        "unsqueeze squeeze expand expand_as view_as flatten unflatten split chunk unbind movedim alias detach "
        "resolve_conj resolve_neg result_type promote_types empty empty_like empty_strided new_empty lift_fresh "
        "size stride sym_size is_same_size contiguous to matmul linear einsum softmax linalg_vecdot dropout "
        "scaled_dot_product_attention max_pool1d item _local_scalar_dense is_nonzero"
    ).split()
)
"""Operators that launch no kernel of their own: views, allocations, and composites whose work is
counted in the operators they call (``matmul`` in ``mm``/``bmm``, ``softmax`` in ``_softmax``, ...)."""


def kernel_launches(run: Callable[[], Any]) -> Counter[str]:
    """The operators ``run()`` calls that would each launch a kernel on a device, by name.

    Every aten operator outside :data:`NO_KERNEL` that no other such operator called, recorded with
    torch.profiler (on the CPU: the count is the device's launch count, whatever runs faster here).
    A launch-bound device step costs in proportion to it, which is why the cost benchmark's GPU
    findings can be checked on a CPU first.
    """
    with _quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    counted: Counter[str] = Counter()
    for event in prof.events():
        if not event.name.startswith("aten::") or event.name in NO_KERNEL:
            continue
        parent = event.cpu_parent
        while parent is not None and (not parent.name.startswith("aten::") or parent.name in NO_KERNEL):
            parent = parent.cpu_parent
        if parent is None:
            counted[event.name] += 1
    return counted
