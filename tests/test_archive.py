"""Scrubbing and archiving a trial tree: secrets out first (contents and names), fail closed,
no symlinks, bounded and streamed."""

import json
import logging
import os
from pathlib import Path

import pytest

from prefect_harbor.secrets import Redactor, redacting_logs, secret_values
from prefect_harbor.storage.archive import CHUNK, ArchiveLimits, MiB, ScrubFailed, archive_folder, archive_name, archive_row, prepare_tree
from prefect_harbor.storage.archive_names import storable
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore

KEY = "sk-archive-test-91c3"
REDACTOR = Redactor.of([KEY])
#: An attempt's Harbor trial name: its archive's folder in the run folder, as in a Harbor job.
TRIAL = "r__0a1b2c3"


def scrub_tree(root: Path, secrets: list[str]) -> list[str]:
    return prepare_tree(root, Redactor.of(secrets)).scrubbed


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
    result = RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success", reward=1.0)
    report = archive_row(result, trial, store, REDACTOR)
    archived = [p.relative_to(tmp_path / "results" / "run" / TRIAL) for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert "agent/link.txt" not in map(str, archived) and not any("linkdir" in str(p) for p in archived)
    assert {"trial.log", "config.json", "verifier/reward.txt", "diagnostics.json", "manifest.json"} <= set(map(str, archived))
    assert report.files == len(archived) - 2  # not counting diagnostics.json and manifest.json


def test_a_tree_that_cannot_be_scrubbed_is_deleted(tmp_path, monkeypatch):
    trial = trial_tree(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError("read-only file system")

    monkeypatch.setattr("prefect_harbor.storage.archive.os.replace", refuse)
    with pytest.raises(ScrubFailed, match="deleted it rather than keep a secret"):
        scrub_tree(trial, [KEY])
    assert not trial.exists()


def test_an_unscrubbable_row_archives_only_its_diagnostics(tmp_path, monkeypatch):
    trial = trial_tree(tmp_path)
    monkeypatch.setattr("prefect_harbor.storage.archive.prepare_tree", _raise_scrub_failed)
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    report = archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="failure"), trial, store, REDACTOR)
    files = [p.name for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert files == ["diagnostics.json"] and "boom" in report.error
    assert json.loads((tmp_path / "results" / "run" / TRIAL / "diagnostics.json").read_text())["archive_error"]


def _raise_scrub_failed(root, redactor, limits, reserved=0):
    raise ScrubFailed("boom")


def test_archive_folder_names_are_safe_and_distinct():
    assert archive_name("plain-id_1.x") == "plain-id_1.x"
    assert archive_name("a/b") != archive_name("a:b")
    assert "/" not in archive_name("../../etc/passwd")


def test_an_attempt_is_archived_in_its_trials_folder_or_under_its_row_when_it_never_reached_harbor():
    assert archive_folder(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success")) == TRIAL
    assert archive_folder(RowResult(row_index=0, row_id="a/b", status="failure")) == f"{archive_name('a/b')}__no-trial"
    assert archive_folder(RowResult(row_index=0, row_id="r", attempt=3, status="cancelled")) == "r.a3__no-trial"


def test_configuration_snapshots_are_redacted():
    config = {"native_agent_kwargs": {"api_key": KEY, "llm_kwargs": {"openai_api_key": KEY, "temperature": 0}}, "note": f"key {KEY}"}
    assert secret_values(config) == [KEY, KEY]
    assert REDACTOR.configuration(config) == {
        "native_agent_kwargs": {"api_key": "[REDACTED]", "llm_kwargs": {"openai_api_key": "[REDACTED]", "temperature": 0}},
        "note": "key [REDACTED]",
    }


def test_file_and_folder_names_holding_the_key_are_renamed_and_listed(tmp_path):
    trial = trial_tree(tmp_path)
    (trial / "agent" / f"dir-{KEY}").mkdir()
    (trial / "agent" / f"dir-{KEY}" / f"name-{KEY}.txt").write_text("plain")
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success"), trial, store, REDACTOR)
    every_path = [str(p) for p in (tmp_path / "results").rglob("*")] + [str(p) for p in trial.rglob("*")]
    assert not [p for p in every_path if KEY in p]
    assert (trial / "agent" / "dir-[REDACTED]" / "name-[REDACTED].txt").read_text() == "plain"
    manifest = json.loads((tmp_path / "results" / "run" / TRIAL / "manifest.json").read_text())
    assert {"agent/dir-[REDACTED]/", "agent/dir-[REDACTED]/name-[REDACTED].txt"} <= set(manifest["scrubbed"])


def test_a_key_split_across_read_chunks_is_still_scrubbed(tmp_path):
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    payload = b"x" * (CHUNK - 5) + KEY.encode() + b"y" * 10
    (trial / "agent" / "big.log").write_bytes(payload)
    assert scrub_tree(trial, [KEY]) == ["agent/big.log"]
    data = (trial / "agent" / "big.log").read_bytes()
    assert KEY.encode() not in data and data == payload.replace(KEY.encode(), b"[REDACTED]")


def test_files_over_the_file_limit_are_cut_and_listed(tmp_path):
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    (trial / "agent" / "stdout.txt").write_bytes(b"a" * (3 * MiB))
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    report = archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success"), trial, store, Redactor(), ArchiveLimits(file_bytes=MiB, row_bytes=10 * MiB))
    archived = tmp_path / "results" / "run" / TRIAL
    assert (archived / "agent" / "stdout.txt").stat().st_size == MiB
    manifest = json.loads((archived / "manifest.json").read_text())
    assert manifest["cut"] == [{"path": "agent/stdout.txt", "bytes": 3 * MiB, "kept_bytes": MiB}]
    assert report.bytes == MiB


def test_once_the_rows_budget_is_spent_the_rest_is_skipped_small_files_first(tmp_path):
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text("{}")
    for name in ("a.bin", "b.bin", "c.bin"):
        (trial / "agent" / name).write_bytes(b"z" * MiB)
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success"), trial, store, Redactor(), ArchiveLimits(file_bytes=MiB, row_bytes=2 * MiB))
    manifest = json.loads((tmp_path / "results" / "run" / TRIAL / "manifest.json").read_text())
    assert [entry["path"] for entry in manifest["files"]] == ["result.json", "agent/a.bin", "agent/b.bin"]
    (cut,) = manifest["cut"]
    assert (cut["path"], cut["bytes"]) == ("agent/b.bin", MiB) and cut["kept_bytes"] < MiB - 2, "the diagnostics' bytes came out of b.bin's share"
    assert [entry["path"] for entry in manifest["skipped"]] == ["agent/c.bin"]
    archived = sum(p.stat().st_size for p in (tmp_path / "results" / "run" / TRIAL).rglob("*") if p.is_file() and p.name != "manifest.json")
    assert archived <= 2 * MiB, "the files and diagnostics.json together keep to the row's limit"


def test_diagnostics_count_inside_the_rows_limit(tmp_path):
    """Issue 28: a 400 MB message made a diagnostics.json of the same size, past every archive limit."""
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    (trial / "agent" / "log.txt").write_bytes(b"z" * MiB)
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    row = RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="failure", err_category="verifier_error", err_message="x" * (5 * MiB))
    archive_row(row, trial, store, Redactor(), ArchiveLimits(file_bytes=MiB, row_bytes=MiB))
    folder = tmp_path / "results" / "run" / TRIAL
    diagnostics = json.loads((folder / "diagnostics.json").read_text())
    assert len(diagnostics["message"]) <= 4096 and diagnostics["message"].startswith("[5,")
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json") <= MiB


def test_names_no_store_can_hold_are_stored_shortened_or_encoded_with_the_original_in_the_manifest(tmp_path):
    """Issue 28: a 250-character file name in /logs made the archive's push fail and stay in _unsent."""
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    long_name = "n" * 246 + ".log"
    (trial / "agent" / long_name).write_text("long")
    odd_name = os.fsdecode(b"odd-\xff\x01name.txt")
    (trial / "agent" / odd_name).write_text("odd")
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    report = archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success"), trial, store, Redactor())
    assert report.error is None and store.unsent == [], store.unsent
    folder = tmp_path / "results" / "run" / TRIAL
    by_original = {entry.get("original"): entry["path"] for entry in json.loads((folder / "manifest.json").read_text())["files"]}
    assert (folder / by_original[f"agent/{long_name}"]).read_text() == "long" and by_original[f"agent/{long_name}"].endswith(".log")
    assert by_original[f"agent/{odd_name}"] == "agent/odd-%FF%01name.txt" and (folder / "agent/odd-%FF%01name.txt").read_text() == "odd"


def test_a_path_too_long_for_an_object_store_key_is_stored_under_long_names():
    deep = "/".join(["d" * 150] * 8) + "/file.txt"
    stored = storable(deep, budget=900)
    assert stored.startswith("long-names/") and stored.endswith("file.txt") and len(stored.encode()) <= 900


def test_files_the_storage_refuses_make_the_archive_say_so(tmp_path, monkeypatch):
    trial = trial_tree(tmp_path)
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb", retry_delays=())
    real = store._put_file
    monkeypatch.setattr(store, "_put_file", lambda path, source: real(path, source) if "agent" not in path else (_ for _ in ()).throw(OSError("refused")))
    report = archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success"), trial, store, REDACTOR)
    assert report.error is not None and "1 of the archive's files were kept locally" in report.error


def test_a_huge_sparse_file_is_cut_without_being_read_whole(tmp_path):
    """``truncate -s 200G`` in /logs/agent once cost the row its reward (MemoryError)."""
    trial = tmp_path / "trial"
    (trial / "agent").mkdir(parents=True)
    with open(trial / "agent" / "sparse.bin", "wb") as sparse:
        sparse.truncate(200 * 1024**3)
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success", reward=1.0), trial, store, REDACTOR, ArchiveLimits(file_bytes=4 * MiB))
    assert (tmp_path / "results" / "run" / TRIAL / "agent" / "sparse.bin").stat().st_size == 4 * MiB


def test_an_archive_that_fails_keeps_the_rows_outcome(tmp_path, monkeypatch):
    from paths import EXAMPLE_TASKS

    from prefect_harbor.blocks import HarborBackend
    from prefect_harbor.rows.sources import TaskResolver
    from prefect_harbor.tasks.archive import archive_result
    from prefect_harbor.tasks.sweep_context import SweepContext
    from prefect_harbor.trial.row_trial import RunContext

    def out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("prefect_harbor.tasks.archive.archive_row", out_of_memory)
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials")).spec()
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fb")
    run = RunContext(run_id="run", trials_dir=tmp_path / "trials")
    sweep = SweepContext(backend=backend, resolver=TaskResolver(backend.sources, cache_dir=run.trials_dir / "_fetched"), run=run, store=store, redactor=REDACTOR)
    row = RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success", reward=1.0, trial_dir=str(trial_tree(tmp_path)))
    archived = archive_result(row, sweep, logging.getLogger("test")).result
    assert (archived.status, archived.reward) == ("success", 1.0)
    assert archived.archive_error == "archiving failed: MemoryError: "


def test_rows_and_log_records_lose_the_key(caplog):
    row = RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="failure", err_message=f"Non-numeric reward '{KEY}'", rewards={f"k-{KEY}": 1.0})
    clean = REDACTOR.model(row)
    assert KEY not in clean.model_dump_json() and clean.rewards == {"k-[REDACTED]": 1.0}
    assert REDACTOR.model(clean) is clean, "a clean row is returned as it is"
    logger = logging.getLogger("prefect_harbor.test_secrets")
    with redacting_logs(REDACTOR):
        try:
            raise ValueError(f"bad {KEY}")
        except ValueError:
            logger.exception("row failed: %s", KEY)
    logger.error("after the sweep %s", KEY)
    assert KEY not in caplog.records[0].getMessage() and KEY not in (caplog.records[0].exc_text or "")
    assert "[REDACTED]" in caplog.text.split("after the sweep")[0]


def test_short_values_are_not_treated_as_secrets():
    assert Redactor.of(["s", "testing", KEY]).secrets == (KEY,)


def test_the_archived_result_points_at_the_archive_where_harbors_viewer_shows_the_trial(tmp_path):
    """The local trial folder of a successful row is deleted after archiving: the trial page must not point there."""
    trial = trial_tree(tmp_path)
    (trial / "result.json").write_text(json.dumps({"trial_name": TRIAL, "trial_uri": trial.as_uri(), "verifier_result": {"rewards": {"reward": 1.0}}}))
    store = RunStore(str(tmp_path / "root"), "run", fallback_dir=tmp_path / "fallback")
    report = archive_row(RowResult(row_index=0, row_id="r", trial_name=TRIAL, status="success"), trial, store, REDACTOR)
    archived = json.loads((tmp_path / "root" / "run" / TRIAL / "result.json").read_text())
    assert archived == {"trial_name": TRIAL, "trial_uri": report.uri, "verifier_result": {"rewards": {"reward": 1.0}}}
    assert report.uri == f"file://{tmp_path}/root/run/{TRIAL}"
