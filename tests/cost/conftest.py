"""One tiny end-to-end benchmark run, shared by the tests that read its results."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import tiny_llama, word_tokenizer

from lorekv.cost import BenchConfig, run_bench

TINY = {
    "model": "tiny",
    "lengths": (32, 64),
    "futures": (1, 2),
    "num_futures": 2,
    "budget": 40,
    "repeats": 1,
    "decode_tokens": 3,
    "threads": 1,
    "compile": False,
}


def tiny_loader(config: BenchConfig):
    return tiny_llama(layers=2), word_tokenizer()  # float64, as tests/compiled: compiled kernels are reused


@pytest.fixture
def tiny_settings() -> dict[str, Any]:
    """The tiny run's settings and loader, for tests that run their own variant."""
    return {"fields": dict(TINY), "loader": tiny_loader}


@pytest.fixture(scope="session")
def tiny_results() -> dict[str, Any]:
    """``run_bench`` on a tiny random Llama at n 32 and 64, M 1 and 2, one repeat, compile off."""
    lines: list[str] = []
    results = run_bench(BenchConfig(**TINY), loader=tiny_loader, log=lines.append)
    results["_log"] = lines
    return results
