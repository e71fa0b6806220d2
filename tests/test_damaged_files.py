"""A crash mid-write: writes are whole or absent, and a file cut short anyway is survived by name."""

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_harbor.cli.commands import app
from prefect_harbor.flows.selection import prepare_resume
from prefect_harbor.storage.control import HEARTBEAT_FILE, STATUS_FILE, Heartbeat, RowTracker
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunManifest, RunStore


class Crash(BaseException):
    """The process dying in the middle of a write."""


def row(index: int) -> RowResult:
    return RowResult(row_index=index, row_id=f"r{index}", task="t", status="success", reward=1.0)


def manifest(state: str = "Running") -> RunManifest:
    return RunManifest(
        run_id="run1", state=state, started_at=datetime.now(UTC), dataset={"fingerprint": "f", "rows": 3}, configuration={"agent": "oracle"}, versions={},
    )  # fmt: skip


def store_with_three_rows(tmp_path: Path) -> RunStore:
    """A run folder as a killed sweep leaves it: three parts, a Running manifest and a status file."""
    store = RunStore(str(tmp_path / "results"), "run1", fallback_dir=tmp_path / "fallback")
    for index in range(3):
        store.write_row(row(index))
    store.write_manifest(manifest())
    tracker = RowTracker(["r0", "r1", "r2"])
    for index in range(3):
        tracker.set(f"r{index}", "success")
    store.write_bytes(STATUS_FILE, tracker.snapshot("Running"))
    return store


def cut_short(path: Path, keep: float = 0.5) -> None:
    content = path.read_bytes()
    path.write_bytes(content[: int(len(content) * keep)])


def test_a_write_interrupted_midway_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    store = RunStore(str(tmp_path / "results"), "run1", fallback_dir=tmp_path / "fallback")
    store.write_manifest(manifest())
    before = (tmp_path / "results" / "run1" / "manifest.json").read_bytes()
    real_pipe = store.fs.pipe_file

    def dies_halfway(path, content, **kwargs):
        real_pipe(path, content[: len(content) // 2], **kwargs)
        raise Crash

    monkeypatch.setattr(store.fs, "pipe_file", dies_halfway)
    with pytest.raises(Crash):
        store.write_manifest(manifest("Completed"))
    assert (tmp_path / "results" / "run1" / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "results" / "run1").iterdir()) == ["manifest.json"], "no temporary file left behind"


def test_resume_survives_a_cut_part(tmp_path, caplog):
    store = store_with_three_rows(tmp_path)
    cut_short(tmp_path / "results" / "run1" / "parts" / "part-000001.parquet")
    with caplog.at_level(logging.WARNING):
        resumed, kept, _ = prepare_resume(store, manifest(), "f")
    assert sorted(kept) == [(0, 1), (2, 1)], "the cut part's row must run again (kept by row and attempt)"
    assert "part-000001.parquet is damaged" in caplog.text and "not finished" in caplog.text
    assert resumed.resumed == 1
    assert sorted(r.row_id for r in store.read_results()) == ["r0", "r2"], "the damaged part is gone, the others kept"


def test_resume_survives_an_empty_manifest(tmp_path, caplog):
    store = store_with_three_rows(tmp_path)
    (tmp_path / "results" / "run1" / "manifest.json").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        resumed, kept, _ = prepare_resume(store, manifest(), "f")
    assert sorted(kept) == [(0, 1), (1, 1), (2, 1)]
    assert resumed.state == "Running" and resumed.configuration == {"agent": "oracle"}
    assert "manifest.json is damaged (0 bytes: Invalid JSON: EOF while parsing" in caplog.text
    assert "could NOT be compared" in caplog.text


def test_a_cut_results_file_falls_back_to_the_parts(tmp_path, caplog):
    store = store_with_three_rows(tmp_path)
    (tmp_path / "results" / "run1" / "results.parquet").write_bytes(b"PAR1")  # what a crash mid-compaction left
    with caplog.at_level(logging.WARNING):
        assert [r.row_id for r in store.read_results()] == ["r0", "r1", "r2"]
    assert "results.parquet is damaged" in caplog.text


def test_status_reports_a_damaged_manifest_and_status_file_in_words(tmp_path):
    store_with_three_rows(tmp_path)
    run = tmp_path / "results" / "run1"
    (run / "manifest.json").write_bytes(b"")
    cut_short(run / STATUS_FILE)
    cut_short(run / "parts" / "part-000002.parquet")
    result = CliRunner().invoke(app, ["status", str(run), "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["rows"] == {"r0": "success", "r1": "success"}, "rebuilt from the parts left whole"
    problems = "\n".join(status["problems"])
    assert "manifest.json is damaged" in problems and "status.json is damaged" in problems and "part-000002.parquet is damaged" in problems


def test_status_of_a_live_run_is_not_stale(tmp_path):
    store = store_with_three_rows(tmp_path)
    store.write_now(HEARTBEAT_FILE, Heartbeat.now(None).model_dump_json().encode())
    result = CliRunner().invoke(app, ["status", str(tmp_path / "results" / "run1"), "--json"])
    assert json.loads(result.stdout)["stale"] is None
