"""The instruments: medians from raw runs (a fake clock makes them exact), differenced decode
times, the growth exponent, and the CPU peak-memory meter."""

from __future__ import annotations

import itertools
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lorekv.cost.measure import PeakMemory, Timed, fit_exponent, own_events, peak_of, per_token, repeat, repeat_seconds

MB = 2**20


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.time = 0.0

    def __call__(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds


def test_repeat_keeps_the_warm_up_apart_and_takes_the_median_of_the_runs() -> None:
    clock = FakeClock()
    durations = iter([5.0, 1.0, 3.0, 2.0])
    timed = repeat(lambda: clock.advance(next(durations)), 3, clock)
    assert timed.first == 5.0 and timed.runs == [1.0, 3.0, 2.0]
    assert timed.median == 2.0 and timed.overhead == 3.0
    assert timed.to_dict() == {"first": 5.0, "runs": [1.0, 3.0, 2.0], "median": 2.0}


def test_repeat_records_each_runs_phases_and_their_medians() -> None:
    clock = FakeClock()
    calls = itertools.count()

    def run() -> dict[str, float]:
        i = next(calls)
        clock.advance(1.0 + i)
        return {"a": float(i), "b": 10.0 * i}

    timed = repeat(run, 3, clock, phases=lambda r: r)
    assert timed.runs == [2.0, 3.0, 4.0]
    assert timed.phases == [{"a": 1.0, "b": 10.0}, {"a": 2.0, "b": 20.0}, {"a": 3.0, "b": 30.0}]
    assert timed.phase_medians() == {"a": 2.0, "b": 20.0}
    assert timed.to_dict()["phase_medians"] == {"a": 2.0, "b": 20.0}


def test_repeat_seconds_uses_the_functions_own_times() -> None:
    times = iter([9.0, 4.0, 6.0])
    timed = repeat_seconds(lambda: next(times), 2)
    assert (timed.first, timed.runs, timed.median) == (9.0, [4.0, 6.0], 5.0)


@pytest.mark.parametrize("fn", [repeat, repeat_seconds])
def test_repeats_below_one_are_refused(fn) -> None:
    args = (lambda: 0.0, 0, FakeClock()) if fn is repeat else (lambda: 0.0, 0)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        fn(*args)


def test_per_token_time_cancels_the_fixed_cost() -> None:
    """decode(k) costs a fixed 7 s (feeding, setup) plus 0.25 s per token; the fixed part drifts
    between repeats (the same within a pair: decode(1) then decode(K))."""
    clock = FakeClock()
    noise = iter([0.0, 0.0, 0.5, 0.5, 0.1, 0.1, 0.3, 0.3, 0.2, 0.2])

    def decode(k: int) -> None:
        clock.advance(7.0 + next(noise, 0.0) + 0.25 * k)

    timing = per_token(decode, 9, 4, clock)
    assert timing.per_token == pytest.approx([0.25] * 4)
    assert timing.median == pytest.approx(0.25) and timing.tokens_per_second == pytest.approx(4.0)
    assert len(timing.long.runs) == len(timing.short.runs) == 4
    assert timing.to_dict()["tokens"] == 9
    with pytest.raises(ValueError, match="decode_tokens"):
        per_token(decode, 1, 1, clock)


@given(
    k=st.floats(-1.0, 3.0),
    c=st.floats(1e-4, 1e3),
    sizes=st.lists(st.integers(2, 100_000), min_size=2, max_size=6, unique=True),
)
def test_fit_exponent_recovers_k_of_a_power_law(k: float, c: float, sizes: list[int]) -> None:
    assert fit_exponent(sizes, [c * s**k for s in sizes]) == pytest.approx(k, abs=1e-6)


def test_fit_exponent_of_noisy_linear_growth_and_undetermined_cases() -> None:
    sizes = [512, 1024, 2048, 4096]
    noisy = [0.1 * s * f for s, f in zip(sizes, [1.05, 0.97, 1.02, 0.99], strict=True)]
    assert fit_exponent(sizes, noisy) == pytest.approx(1.0, abs=0.05)
    assert fit_exponent([512], [1.0]) is None
    assert fit_exponent([512, 512], [1.0, 2.0]) is None
    assert fit_exponent([512, 1024], [1.0, 0.0]) is None
    with pytest.raises(ValueError, match="same length"):
        fit_exponent([1, 2], [1.0])


def test_peak_of_is_the_running_maximum_of_the_changes_in_time_order() -> None:
    assert peak_of([(0, 10), (1, 5), (2, -10), (3, 3), (4, -3)]) == (15, 5)
    assert peak_of([(0, -8), (1, 4)]) == (0, -4)
    assert peak_of([]) == (0, 0)


def test_peak_memory_sees_an_allocation_made_inside() -> None:
    with PeakMemory() as meter:
        a = torch.ones(8 * MB, dtype=torch.uint8)
    assert meter.peak >= 8 * MB and meter.retained >= 8 * MB
    del a


def test_peak_memory_does_not_count_freed_memory_afterwards() -> None:
    before = torch.ones(16 * MB, dtype=torch.uint8)
    with PeakMemory() as meter:
        a = torch.ones(8 * MB, dtype=torch.uint8)
        del a
        b = torch.ones(2 * MB, dtype=torch.uint8)
        del before  # allocated before the block: neither counted nor subtracted
    assert 8 * MB <= meter.peak < 9 * MB, meter.peak  # not 8 + 2: a was freed before b
    assert 2 * MB <= meter.retained < 3 * MB
    with PeakMemory() as later:
        c = torch.ones(1 * MB, dtype=torch.uint8)
    assert MB <= later.peak < 2 * MB, "the earlier block's tensors do not count in a later one"
    del b, c


def test_only_the_blocks_own_allocations_and_their_frees_count() -> None:
    """The allocator reports a free of memory allocated before the block with the size it last
    recorded at that address, stale when an earlier block's tensor lived there (seen in CI as a
    retained -6 MiB): frees at addresses the block did not allocate are not the block's."""
    events = [(5, 0xA, 8 * MB), (6, 0xA, -8 * MB), (7, 0xB, 2 * MB), (8, 0xC, -8 * MB), (9, 0xA, -8 * MB)]
    assert own_events(events) == [(5, 8 * MB), (6, -8 * MB), (7, 2 * MB)]
    assert peak_of(own_events(reversed(events))) == (8 * MB, 2 * MB), "taken in time order"
    reused = [(1, 0xA, MB), (2, 0xA, -MB), (3, 0xA, 4 * MB), (4, 0xA, -4 * MB)]
    assert peak_of(own_events(reused)) == (4 * MB, 0), "an address reused inside the block"


def test_peak_memory_keeps_the_profilers_chatter_off_stderr(capfd) -> None:
    before = torch.ones(MB, dtype=torch.uint8)
    with PeakMemory():
        del before  # the allocator warns about a block allocated before profiling
    err = capfd.readouterr().err
    assert "profiling started" not in err and "profiler_start" not in err, err


def test_timed_median_is_statistics_median() -> None:
    timed = Timed(first=1.0, runs=[0.3, 0.1, 0.2, 0.4])
    assert timed.median == statistics.median([0.3, 0.1, 0.2, 0.4])
