"""Certification verdicts, their store and the sweep's gate: no container, no server."""


import pytest
from tasks_factory import write_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.certification import Attempts, CertificationStore, gate, judge, task_digest
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.certify import dataset_of, tasks_under
from prefect_harbor.scoring import scoring_of

SCORED = {"status": "success", "reward": 1.0}
ZERO = {"status": "success", "reward": 0.0}
AGENT_TIMEOUT = {"status": "failure", "err_category": "timeout", "err_phase": "agent"}
SANDBOX_FAILED = {"status": "failure", "err_category": "agent_error", "err_phase": "environment_setup", "failure_cause": "sandbox_failed"}


def verdict(oracle: list[dict], nop: list[dict]) -> str:
    return judge("t", "sha256:" + "0" * 64, Attempts.of(oracle), Attempts.of(nop)).verdict


def test_the_verdicts_by_the_scoring_contract():
    assert verdict([SCORED] * 3, [ZERO] * 3) == "certified"
    assert verdict([SCORED] * 3, [ZERO, SCORED, ZERO]) == "trivial"
    assert verdict([ZERO] * 3, [ZERO] * 3) == "broken"
    assert verdict([SCORED, ZERO, SCORED], [ZERO] * 3) == "flaky"
    assert verdict([SCORED, AGENT_TIMEOUT, SCORED], [ZERO] * 3) == "flaky", "an oracle that times out is not rewarded: it counts as 0"
    assert verdict([SCORED, SANDBOX_FAILED, SCORED], [ZERO] * 3) == "unsettled", "an attempt that measured nothing settles nothing"
    assert verdict([SCORED], [{"status": "cancelled"}]) == "unsettled"
    assert verdict([{"status": "success", "reward": 0.5}] * 2, [ZERO] * 2) == "broken", "only a full reward (1.0) passes"


def test_a_verdict_says_its_counts_and_the_flake_rate():
    flaky = judge("t", "sha256:" + "ab" * 32, Attempts.of([SCORED, ZERO, SCORED, SANDBOX_FAILED]), Attempts.of([ZERO]))
    assert flaky.verdict == "unsettled" and flaky.flake_rate == pytest.approx(1 / 3)
    assert flaky.reason.endswith("(oracle rewarded in full 2 of 3 (1 not scored: sandbox); nop rewarded in full 0 of 1)")
    assert flaky.label.startswith("unsettled (sha256:abababababab): ")


def test_the_store_keeps_one_certification_per_digest(tmp_path):
    store = CertificationStore(str(tmp_path / "results"))
    assert not store.exists() and store.load("sha256:" + "1" * 64) is None
    certification = judge("t", "sha256:" + "1" * 64, Attempts.of([SCORED]), Attempts.of([ZERO]))
    uri = store.save(certification)
    assert uri.endswith(f"/results/certifications/{'1' * 64}.json") and store.exists()
    assert store.load(certification.digest) == certification


def test_a_changed_file_is_new_content(tmp_path):
    task = write_task(tmp_path, "t")
    before = task_digest(task)
    assert before.startswith("sha256:") and task_digest(task) == before
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    assert task_digest(task) != before


def test_the_gate_labels_every_certified_task_and_refuses_the_rest_only_when_asked(tmp_path):
    tasks = {name: write_task(tmp_path / "tasks", name) for name in ("good", "lazy", "new")}
    store = CertificationStore(str(tmp_path / "results"))
    assert gate(tasks, store, certified_only=False).labels == {}, "nothing certified: nothing to read"
    store.save(judge("good", task_digest(tasks["good"]), Attempts.of([SCORED]), Attempts.of([ZERO])))
    store.save(judge("lazy", task_digest(tasks["lazy"]), Attempts.of([SCORED]), Attempts.of([SCORED])))

    labels_only = gate(tasks, store, certified_only=False)
    assert sorted(labels_only.labels) == [str(tasks["good"]), str(tasks["lazy"])] and labels_only.refused == {}
    required = gate(tasks, store, certified_only=True)
    assert sorted(required.refused) == [str(tasks["lazy"]), str(tasks["new"])]
    assert required.refused[str(tasks["lazy"])].startswith("task lazy is not certified: its certification says trivial (sha256:")
    assert "task new is not certified: its content (sha256:" in required.refused[str(tasks["new"])]
    assert "was never certified; certify its current content (prefect-harbor certify" in required.refused[str(tasks["new"])]


def test_an_uncertified_row_is_not_scored_with_its_own_cause():
    record = {"status": "failure", "err_category": "validation_error", "err_phase": "certification"}
    assert scoring_of(record) == ("not_scored", "uncertified")


def test_certify_names_what_is_wrong_with_its_tasks_folder(tmp_path):
    with pytest.raises(ConfigurationError, match="tasks_dir: .* is not a folder"):
        tasks_under(tmp_path / "missing", None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="holds no Harbor task"):
        tasks_under(tmp_path / "empty", None)
    write_task(tmp_path / "tasks", "a")
    with pytest.raises(ConfigurationError, match="tasks: no Harbor task b under"):
        tasks_under(tmp_path / "tasks", ["a", "b"])
    assert list(tasks_under(tmp_path / "tasks", None)) == ["a"]
    assert dataset_of({"a": tmp_path}) == b'{"id": "a", "metadata": {"harbor_task_id": "a"}}\n'


def test_certified_tasks_only_is_a_block_field_the_spec_carries(tmp_path):
    write_task(tmp_path, "a")
    backend = HarborBackend(tasks_dir=tmp_path, task_mode="dataset", agent="nop", certified_tasks_only=True)
    spec = backend.spec()
    assert spec.scoring.certified_tasks_only and spec.agent_name == "nop"


def test_a_rows_log_line_says_what_its_reward_was_checked_for():
    from prefect_harbor.outcome import row_line
    from prefect_harbor.storage.results import RowResult

    label = judge("t", "sha256:" + "ab" * 32, Attempts.of([SCORED]), Attempts.of([ZERO])).label
    row = RowResult(row_index=0, row_id="r", task="t", status="success", reward=1.0, verifier_mode="shared", verifier_tampering=[], certification=label)
    assert "reward 1; checked: verifier shared, no tampering seen, task certified (sha256:abababababab);" in row_line(row)
    unchecked = row.model_copy(update={"verifier_mode": None, "verifier_tampering": None, "certification": None})
    assert "checked" not in row_line(unchecked)
