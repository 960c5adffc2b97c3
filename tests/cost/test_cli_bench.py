"""``lorekv bench`` parses its options into a BenchConfig, runs it, prints the table and writes JSON;
bad options fail before the model loads."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from lorekv.cli import app


def run(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_bench_parses_runs_prints_and_writes(monkeypatch, tiny_results, tmp_path) -> None:
    seen = {}

    def fake_run_bench(config, *, log=None, **kwargs):
        seen["config"] = config
        log("progress line")
        return tiny_results

    monkeypatch.setattr("lorekv.cost.run_bench", fake_run_bench)
    out = tmp_path / "b.json"
    code, output = run(
        "bench", "--lengths", "64,32", "--futures", "1,2", "--num-futures", "2", "--repeats", "1",
        "--decode-tokens", "3", "--budget", "40", "--tokens", "4", "--scorers", "loo,projected_loo",
        "--threads", "1", "--no-compile", "--batch-sizes", "4,1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    config = seen["config"]
    assert config.lengths == (32, 64) and config.futures == (1, 2) and config.num_futures == 2
    assert (config.repeats, config.decode_tokens, config.budget, config.tokens) == (1, 3, 40, 4)
    assert config.scorers == ("loo", "projected_loo") and config.threads == 1 and config.compile is False
    assert config.batch_sizes == (1, 4)
    assert "== Decoding" in output and "progress line" in output
    assert json.loads(out.read_text())["lengths"].keys() == {"32", "64"}
    assert output.rstrip().endswith(f"Wrote {out}")


def test_bench_defaults(monkeypatch, tiny_results, tmp_path) -> None:
    seen = {}
    monkeypatch.setattr("lorekv.cost.run_bench", lambda config, **kw: seen.setdefault("c", config) and tiny_results)
    monkeypatch.chdir(tmp_path)
    code, output = run("bench")
    assert code == 0, output
    assert seen["c"].lengths == (512, 1024, 2048, 4096) and seen["c"].compile is True
    assert seen["c"].batch_sizes == (1, 2, 4, 8)
    assert (tmp_path / "results" / "bench" / "smollm2-135m-instruct-cpu.json").is_file()


@pytest.mark.parametrize(
    "args,match",
    [
        (["--lengths", "512,x"], "lengths must be comma-separated integers"),
        (["--lengths", "16"], r"lengths: each length must be >= 32"),
        (["--lengths", "100000"], r"lengths must be <= \d+ for smollm2"),
        (["--futures", "0"], "futures must be integers >= 1"),
        (["--repeats", "0"], "repeats"),
        (["--decode-tokens", "1"], "decode_tokens"),
        (["--budget", "8"], "budget: budget must be > window"),
        (["--scorers", "nope"], "scorers must name one or more of"),
        (["--device", "tpu"], "device must be cpu, cuda"),
        (["--dtype", "half"], "dtype"),
        (["--threads", "0"], "threads"),
        (["--out", "."], r"out: \. is a directory"),
        (["--batch-sizes", "2,4"], r"batch_sizes must include 1"),
        (["--batch-sizes", "1,x"], r"batch_sizes must be comma-separated integers"),
    ],
)
def test_bad_options_fail_before_the_model_loads(monkeypatch, args, match) -> None:
    def forbidden(*a, **k):
        raise AssertionError("the benchmark started before the options were checked")

    monkeypatch.setattr("lorekv.cost.run_bench", forbidden)
    monkeypatch.setattr("lorekv.cost.known_context", lambda model: 8192)
    code, output = run("bench", *args)
    assert code == 2, output
    assert output.startswith("error: ") and output.count("\n") == 1, output
    assert re.search(match, output), output
