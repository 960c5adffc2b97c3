"""ResultsFile: atomic rewrites and resumption."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import time

import pytest
from pydantic import BaseModel, ConfigDict

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


def test_a_duplicated_row_is_refused_with_its_line_number(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "correct": true}\n{"id": "b", "correct": true}\n{"id": "a", "correct": true}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:3: duplicate id 'a'"):
        ResultsFile(path)
    results = ResultsFile(tmp_path / "s.jsonl")
    results.add({"id": "a"})
    with pytest.raises(ValueError, match="duplicate"):
        results.add({"id": "a"})
    assert len(ResultsFile(tmp_path / "s.jsonl").records) == 1


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    correct: bool
    seconds: float


def test_rows_of_the_wrong_shape_are_refused_with_their_line_number(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    row = {"id": "m|full|seed=0", "correct": True, "seconds": 1.0}
    ResultsFile(path, schema=Row).add(row)
    assert ResultsFile(path, schema=Row).done() == {row["id"]}
    for bad, problem in [({**row, "correct": "yes"}, "correct"), ({"id": "x"}, "Field required"), ([1, 2], "object")]:
        path.write_text(json.dumps(row | {"id": "ok"}) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=rf"r.jsonl:2.*{problem}"):
            ResultsFile(path, schema=Row)
    with pytest.raises(ValueError, match="does not fit Row"):
        ResultsFile(tmp_path / "t.jsonl", schema=Row).add({**row, "seconds": "slow"})


def test_a_directory_is_not_a_results_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        ResultsFile(tmp_path)


def test_results_files_follow_the_umask(tmp_path) -> None:
    previous = os.umask(0o022)
    try:
        ResultsFile(tmp_path / "r.jsonl").add({"id": "a"})
        os.umask(0o077)
        ResultsFile(tmp_path / "s.jsonl").add({"id": "a"})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "r.jsonl").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "s.jsonl").stat().st_mode) == 0o600


def test_temporaries_of_a_killed_run_are_removed_on_the_next_start(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    ResultsFile(path).add({"id": "a"})
    (tmp_path / ".r.jsonl-abc123").write_text('{"id": "half')
    assert ResultsFile(path).done() == {"a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def write_rows(path, count: int) -> None:
    """A resumable loop as the harness runs one: skip what the file holds, add the rest one by one."""
    results = ResultsFile(path, schema=Row)
    done = results.done()
    for seed in range(count):
        if str(seed) not in done:
            time.sleep(0.001)  # the work of one row
            results.add({"id": str(seed), "correct": seed % 2 == 0, "seconds": 0.001})


def test_killed_runs_lose_nothing_duplicate_nothing_and_leave_no_temporaries(tmp_path, monkeypatch) -> None:
    """Fault injection: a forked run is killed (SIGKILL) at random moments 25 times, then finishes."""
    path, rows = tmp_path / "r.jsonl", 150
    rng = random.Random(0)
    seen = [0]
    for _ in range(25):
        target = seen[-1] + rng.randint(0, 8)
        pid = os.fork()
        if pid == 0:  # the child writes until it is killed
            try:
                write_rows(path, rows)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (path.read_bytes().count(b"\n") if path.exists() else 0) < target:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 0.003))  # land anywhere in the next row: work, write, fsync
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), "the run finished before it was killed"
        records = ResultsFile(path).records if path.exists() else []  # reading cleans temporaries
        assert [int(r["id"]) for r in records] == list(range(len(records))), "rows in order, none lost or doubled"
        assert not list(tmp_path.glob(".r.jsonl-*"))
        assert len(records) >= seen[-1]
        seen.append(len(records))
    assert len(set(seen)) > 10, f"the kills should land at different points, got {seen}"
    write_rows(path, rows)
    assert [int(r["id"]) for r in ResultsFile(path).records] == list(range(rows))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_each_record_is_appended_whole_and_flushed_before_add_returns(tmp_path, monkeypatch) -> None:
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path)
    results.add({"id": "a"})
    inode = path.stat().st_ino
    events: list[str] = []
    real_write, real_fsync = os.write, os.fsync
    monkeypatch.setattr(os, "write", lambda fd, data: (events.append(f"write {data!r}"), real_write(fd, data))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: pytest.fail("an append must not rewrite the file"))
    results.add({"id": "b"})
    assert events == ['write b\'{"id": "b"}\\n\'', "fsync"], events  # one write of the whole line, then fsync
    assert path.stat().st_ino == inode
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_rest_kept(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "sco')
    with pytest.warns(UserWarning, match="torn last line"):
        results = ResultsFile(path)
    assert results.done() == {"a", "b"}
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    results.add({"id": "c"})
    assert [r["id"] for r in ResultsFile(path).records] == ["a", "b", "c"]


def test_a_short_write_is_undone_and_reported(tmp_path, monkeypatch) -> None:
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path)
    results.add({"id": "a"})
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:5]))
    with pytest.raises(OSError, match="disk full"):
        results.add({"id": "b"})
    assert path.read_text() == '{"id": "a"}\n'
    assert results.done() == {"a"}


def test_the_run_header_is_the_first_line_and_another_runs_file_is_refused(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    header = {"type": "header", "grid": "abc", "machine": "here"}
    results = ResultsFile(path, header=header)
    results.add({"id": "a"})
    assert json.loads(path.read_text().splitlines()[0]) == header
    resumed = ResultsFile(path, header={**header, "machine": "elsewhere"})
    assert resumed.header == header and resumed.done() == {"a"}
    with pytest.raises(ValueError, match="another run.*'abc'.*'xyz'"):
        ResultsFile(path, header={"type": "header", "grid": "xyz"})
    headerless = tmp_path / "s.jsonl"
    ResultsFile(headerless).add({"id": "a"})
    with pytest.raises(ValueError, match="no run header"):
        ResultsFile(headerless, header=header)
    path.write_text(path.read_text() + json.dumps(header) + "\n")
    with pytest.raises(ValueError, match="r.jsonl:3: a run header may only be the first line"):
        ResultsFile(path)
