"""Scrubbing and archiving a trial tree: secrets out first, fail closed, no symlinks."""

import json
from pathlib import Path

import pytest

from prefect_harbor.archive import ScrubFailed, archive_name, archive_row, scrub_tree
from prefect_harbor.results import RowResult
from prefect_harbor.storage import RunStore, redact, secret_values

KEY = "sk-archive-test-91c3"


def trial_tree(root: Path) -> Path:
    trial = root / "trial"
    (trial / "agent" / "deep").mkdir(parents=True)
    (trial / "verifier").mkdir()
    (trial / "trial.log").write_text(f"using {KEY} now\n")
    (trial / "config.json").write_text(json.dumps({"agent": {"kwargs": {"api_key": KEY}}}))
    (trial / "agent" / "deep" / "out.bin").write_bytes(b"\x00" + KEY.encode() + b"\xff")
    (trial / "verifier" / "reward.txt").write_text("1\n")
    return trial


def test_every_copy_of_the_key_is_scrubbed_in_place(tmp_path):
    trial = trial_tree(tmp_path)
    changed = scrub_tree(trial, [KEY])
    assert sorted(changed) == ["agent/deep/out.bin", "config.json", "trial.log"]
    assert not [p for p in trial.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert (trial / "trial.log").read_text() == "using [REDACTED] now\n"


def test_symlinks_are_neither_followed_nor_archived(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text(f"host file with {KEY}")
    trial = trial_tree(tmp_path)
    (trial / "agent" / "link.txt").symlink_to(outside)
    (trial / "verifier" / "linkdir").symlink_to(tmp_path)
    scrub_tree(trial, [KEY])
    assert outside.read_text() == f"host file with {KEY}", "a symlink target outside the tree was rewritten"
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    result = RowResult(row_index=0, row_id="r", status="success", reward=1.0)
    report = archive_row(result, trial, store, [KEY])
    archived = [p.relative_to(tmp_path / "results" / "run" / "archives" / "r") for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert "agent/link.txt" not in map(str, archived) and not any("linkdir" in str(p) for p in archived)
    assert {"trial.log", "config.json", "verifier/reward.txt", "diagnostics.json"} <= set(map(str, archived))
    assert report.files == len(archived)


def test_a_tree_that_cannot_be_scrubbed_is_deleted(tmp_path, monkeypatch):
    trial = trial_tree(tmp_path)

    def refuse(self, data):
        raise OSError("read-only file system")

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(ScrubFailed, match="deleted it rather than keep a secret"):
        scrub_tree(trial, [KEY])
    assert not trial.exists()


def test_an_unscrubbable_row_archives_only_its_diagnostics(tmp_path, monkeypatch):
    trial = trial_tree(tmp_path)
    monkeypatch.setattr("prefect_harbor.archive.scrub_tree", _raise_scrub_failed)
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    report = archive_row(RowResult(row_index=0, row_id="r", status="failure"), trial, store, [KEY])
    files = [p.name for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert files == ["diagnostics.json"] and "boom" in report.error
    assert json.loads((tmp_path / "results" / "run" / "archives" / "r" / "diagnostics.json").read_text())["archive_error"]


def _raise_scrub_failed(root, secrets):
    raise ScrubFailed("boom")


def test_archive_folder_names_are_safe_and_distinct():
    assert archive_name("plain-id_1.x") == "plain-id_1.x"
    assert archive_name("a/b") != archive_name("a:b")
    assert "/" not in archive_name("../../etc/passwd")


def test_configuration_snapshots_are_redacted():
    config = {"native_agent_kwargs": {"api_key": KEY, "llm_kwargs": {"openai_api_key": KEY, "temperature": 0}}, "note": f"key {KEY}"}
    assert secret_values(config) == [KEY, KEY]
    assert redact(config, [KEY]) == {
        "native_agent_kwargs": {"api_key": "[REDACTED]", "llm_kwargs": {"openai_api_key": "[REDACTED]", "temperature": 0}},
        "note": "key [REDACTED]",
    }
