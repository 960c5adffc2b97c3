"""With ``compile`` on, the benchmark times the compiled scorers beside the eager ones and reports
each first call apart from the steady state. Inductor takes minutes here on a small busy CPU, so
``torch.compile`` is replaced by a stand-in that makes only the first call of each kernel slow (the
compiled kernels themselves are tested against eager ones in ``tests/compiled``)."""

from __future__ import annotations

import functools
import time

import pytest

from lorekv.cost import BenchConfig, render, run_bench

COMPILE_SECONDS = 0.3


@pytest.fixture
def fake_compile(monkeypatch):
    """``compiled(fn)``: ``fn`` whose first call sleeps COMPILE_SECONDS (dynamic shapes: one "compilation")."""
    compiled_kernels: list[str] = []

    @functools.cache
    def compiled(fn):
        def run(*args, **kwargs):
            if fn.__qualname__ not in compiled_kernels:
                compiled_kernels.append(fn.__qualname__)
                time.sleep(COMPILE_SECONDS)
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr("lorekv.scorers.base.compiled", compiled)
    monkeypatch.setattr("lorekv.hf.attention.compiled", compiled)
    return compiled_kernels


def test_compiled_scorers_are_timed_with_their_first_call_apart(tiny_settings, fake_compile) -> None:
    fields = {**tiny_settings["fields"], "futures": (2,), "compile": True, "scorers": ("attention_mass", "loo")}
    results = run_bench(BenchConfig(**fields), loader=tiny_settings["loader"])
    assert results["compile"] is True
    kernels = {"AttentionMassScorer.query_scores", "LOOScorer.query_scores", "ProjectedLOOScorer.query_scores"}
    kernels.add("shared_prefix_attention")  # the futures' attention
    assert kernels <= set(fake_compile), "the pipelines (LORE-KV's futures and scorer) and the scorers ran compiled"
    for length in results["lengths"].values():
        for name in ("attention_mass", "loo"):
            compiled, eager = length["scorers"][name]["compiled"], length["scorers"][name]["eager"]
            assert compiled is not None and compiled["median"] < COMPILE_SECONDS / 3
            assert eager["median"] < COMPILE_SECONDS / 3
    overhead = results["first_call_overhead"]
    for name in ("attention_mass (compiled)", "loo (compiled)", "lore_kv compression"):
        assert overhead[name]["32"] >= COMPILE_SECONDS * 0.9, (name, overhead[name])
        assert overhead[name]["64"] < COMPILE_SECONDS / 2, (name, overhead[name])
    assert overhead["attention_mass (eager)"]["32"] < COMPILE_SECONDS / 2
    text = render(results)
    assert "attention_mass (compiled)" in text and "compile on" in text


def test_compile_off_times_eager_scorers_only(tiny_results) -> None:
    assert all(kinds["compiled"] is None for kinds in tiny_results["lengths"]["32"]["scorers"].values())
    assert "(compiled)" not in " ".join(tiny_results["first_call_overhead"])
