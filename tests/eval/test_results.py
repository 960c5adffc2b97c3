"""ResultsFile: atomic rewrites and resumption."""

from __future__ import annotations

import pytest

from lorekv.eval.results import ResultsFile


def test_records_survive_a_restart_and_nothing_half_written_is_left(tmp_path) -> None:
    path = tmp_path / "out" / "r.jsonl"
    first = ResultsFile(path)
    first.add({"id": "a", "correct": True})
    first.add({"id": "b", "correct": False})
    resumed = ResultsFile(path)
    assert resumed.done() == {"a", "b"}
    assert [r["correct"] for r in resumed.records] == [True, False]
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.jsonl"]


def test_a_failed_write_keeps_the_previous_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path)
    results.add({"id": "a"})
    before = path.read_text()
    with pytest.raises(TypeError):
        results.add({"id": "b", "bad": object()})
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
    assert results.done() == {"a"}


def test_corrupt_line_is_reported_with_its_number(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a"}\n{"id": \n')
    with pytest.raises(ValueError, match="r.jsonl:2"):
        ResultsFile(path)
