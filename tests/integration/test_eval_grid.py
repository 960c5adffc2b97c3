"""One tiny end-to-end grid on the real bundled SmolLM2, from the command line: run, resume, report."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from lorekv.cli import app

pytestmark = pytest.mark.integration

GRID = {
    "name": "ci",
    "models": ["smollm2-135m-instruct"],
    "methods": ["full", "lore_kv", {"name": "snapkv", "preset": "snapkv", "options": {"window": 4}}],
    "budgets": [16],
    "tasks": [{"name": "niah_single", "haystack": "noise"}],
    "lengths": [400],
    "samples": 2,
}


def test_a_tiny_grid_runs_resumes_and_reports(tmp_path) -> None:
    pytest.importorskip("gguf")
    grid = tmp_path / "ci.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    out = tmp_path / "ci.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["eval", str(grid), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]
    assert json.loads(lines[0])["type"] == "header" and len(rows) == 2 * 3
    full = [r for r in rows if r["method"] == "full"]
    assert all(r["score"] == 1.0 for r in full), [r["prediction"] for r in full]  # the noise needle, 400 tokens
    assert all(r["tokens"] <= 400 and r["kept"] == 16 for r in rows if r["method"] != "full")

    again = runner.invoke(app, ["eval", str(grid), "--out", str(out), "--no-progress"])
    assert again.exit_code == 0 and out.read_text().splitlines() == lines, "a finished grid is not redone"

    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report" / "report.md").read_text()
    assert "niah_single[haystack=noise]" in text and "`full`" in text
