"""``lorekv gpu-check``: the CPU branch end to end at the smallest sizes, the GPU branch with the device
calls stood in for, and a failing check's exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lorekv.cli import app
from lorekv.cost import gpu_check

TINY = gpu_check.Sizes(layers=1, width=8, lengths=(128,), repeats=1, decode_tokens=2, budget_s=600, demo=False)


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_check, "CPU_SIZES", TINY)
    monkeypatch.setattr(gpu_check, "GPU_SIZES", TINY)


def test_cpu_run_writes_json_and_table_and_says_gpu_figures_not_taken(tiny, tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    result = CliRunner().invoke(app, ["gpu-check", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "GPU figures not taken" in result.output
    data = json.loads(out.read_text())
    assert data["gpu"] is False and data["passed"] is True and data["note"] == gpu_check.NOT_TAKEN
    assert {c["dtype"] for c in data["checks"]} == {"float32", "bfloat16"}
    assert all(c["error"] <= c["tolerance"] for c in data["checks"])
    assert sorted(data["cost"]["lengths"]) == ["128"]
    entry = data["cost"]["lengths"]["128"]
    assert entry["lore_kv_s"] > 0 and set(entry["peak_bytes"]) == {"transformers_prefill", "snapkv", "lore_kv"}


def test_gpu_branch_with_device_calls_stood_in(tiny, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch.cuda is faked and the tensors are routed to the CPU: the GPU sizes, the device facts and the JSON."""
    props = type("Props", (), {"total_memory": 141 * 2**30})()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Stand-in H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: props)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *_: 0)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(gpu_check, "placement", lambda: "cpu")
    skipped = gpu_check.Sizes(**{**gpu_check.asdict(TINY), "lengths": (128, 4096), "budget_s": 0.0})
    monkeypatch.setattr(gpu_check, "GPU_SIZES", skipped)
    out = tmp_path / "gpu.json"
    result = CliRunner().invoke(app, ["gpu-check", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["gpu"] is True and "note" not in data
    assert data["device"] == {
        "device": "cuda", "torch": torch.__version__, "cuda": "12.8", "name": "Stand-in H200",
        "memory_bytes": 141 * 2**30,
    }  # fmt: skip
    assert data["sizes"]["lengths"] == [128, 4096]
    assert data["cost"]["skipped"] == [4096] and "time budget" in data["cost"]["note"]
    assert "Stand-in H200" in result.output and "GPU figures not taken" not in result.output


def test_a_failing_check_gives_a_nonzero_exit(tiny, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_check, "check_cascade", lambda *_: 1.0)
    monkeypatch.setattr(gpu_check, "cost", lambda *_: {"lengths": {}, "skipped": []})
    out = tmp_path / "fail.json"
    result = CliRunner().invoke(app, ["gpu-check", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 1
    assert "FAIL" in result.output and json.loads(out.read_text())["passed"] is False


@pytest.mark.integration
def test_smollm2_demo_answers_check_on_cpu() -> None:
    check = gpu_check.check_demo("cpu")
    assert check.passed and check.error == 0


def test_no_demo_leaves_the_demo_check_out_and_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_check, "CPU_SIZES", gpu_check.replace(TINY, demo=True))
    monkeypatch.setattr(gpu_check, "check_demo", lambda *_: pytest.fail("the demo check ran under --no-demo"))
    monkeypatch.setattr(gpu_check, "cost", lambda *_: {"lengths": {}, "skipped": []})
    out = tmp_path / "no-demo.json"
    result = CliRunner().invoke(app, ["gpu-check", "--device", "cpu", "--no-demo", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["sizes"]["demo"] is False and "smollm2 demo check not run" in result.output
    assert "smollm2 demo tokens" not in {c["name"] for c in data["checks"]}


def test_the_next_length_is_estimated_from_the_measured_growth() -> None:
    assert gpu_check.estimate_seconds([(8192, 30.0)], 32768) == pytest.approx(30.0 * 4**gpu_check.FIRST_GROWTH)
    assert gpu_check.estimate_seconds([(8192, 30.0), (32768, 240.0)], 65536) == pytest.approx(240.0 * 2**1.5)
    assert gpu_check.estimate_seconds([(8192, 30.0), (32768, 60.0)], 65536) == pytest.approx(120.0)  # k >= 1
    assert gpu_check.estimate_seconds([(1024, 1.0), (2048, 8.0)], 4096) == pytest.approx(32.0)  # k <= 2
