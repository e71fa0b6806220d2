"""A row's verdict on its verifier (issue 28): the sandbox's evidence of tampering becomes the
verifier_tampering column, and on_tampering flags or fails the row; the summary counts them."""

import os

from prefect_harbor.outcome import describe, row_line, table_row
from prefect_harbor.sandbox.container_view import lstat_inside
from prefect_harbor.sandbox.trial_report import TrialReport
from prefect_harbor.storage.results import RowResult, RunTally
from prefect_harbor.trial.tampering import judge

SCORED = RowResult(row_index=0, row_id="r", status="success", reward=1.0)


def trial_with(tmp_path, *findings: list[str]):
    report = TrialReport(tmp_path, "trial")
    for number, found in enumerate(findings):
        report.put("verifications", {"findings": found, "left_running": []}, key=str(number))
    return tmp_path


def test_no_verifier_run_checked_is_null_and_a_clean_one_is_empty(tmp_path):
    assert judge(SCORED, tmp_path, "flag").verifier_tampering is None
    assert judge(SCORED, trial_with(tmp_path, []), "flag").verifier_tampering == []


def test_flag_keeps_the_outcome_and_says_what_was_found(tmp_path):
    row = judge(SCORED, trial_with(tmp_path, ["changed /usr/bin/bash"], ["changed /usr/bin/bash", "reward.txt changed after test.sh exited"]), "flag")
    assert (row.status, row.reward, row.err_message) == ("success", 1.0, None)
    assert row.verifier_tampering == ["changed /usr/bin/bash", "reward.txt changed after test.sh exited"]
    assert describe(row) == "reward 1; verifier tampering: changed /usr/bin/bash; reward.txt changed after test.sh exited"
    assert row_line(row).startswith("Row r (no task): success, reward 1; verifier tampering: changed /usr/bin/bash; reward.txt")
    assert table_row(row)["message"] == "verifier tampering: changed /usr/bin/bash; reward.txt changed after test.sh exited"


def test_fail_makes_the_row_a_verifier_tampering_failure_with_no_reward(tmp_path):
    row = judge(SCORED, trial_with(tmp_path, ["changed /usr/bin/rm"]), "fail")
    assert (row.status, row.reward, row.err_category, row.err_phase) == ("failure", None, "verifier_tampering", "verifier")
    assert row.err_message == "verifier tampering: changed /usr/bin/rm (the verifier's reward was 1)"


def test_a_failed_row_keeps_its_cause_and_adds_the_evidence_under_flag(tmp_path):
    failed = RowResult(row_index=0, row_id="r", status="failure", err_category="verifier_error", err_message="RewardFileNotFoundError: none")
    row = judge(failed, trial_with(tmp_path, ["changed /usr/bin/bash"]), "flag")
    assert (row.err_category, row.err_message) == ("verifier_error", "RewardFileNotFoundError: none; verifier tampering: changed /usr/bin/bash")


def test_the_summary_counts_rows_with_evidence(tmp_path):
    tally = RunTally()
    tally.add(SCORED.model_copy(update={"verifier_tampering": []}))
    tally.add(SCORED.model_copy(update={"verifier_tampering": ["changed /usr/bin/bash"]}))
    summary = tally.summary("run", "file:///r")
    assert summary.verifier_tampering == 1 and "1 with verifier tampering evidence" in summary.headline()


def test_looking_inside_a_container_never_follows_a_planted_link(tmp_path):
    root = tmp_path / "root"
    (root / "logs").mkdir(parents=True)
    (tmp_path / "host-secret").mkdir()
    (tmp_path / "host-secret" / "reward.json").write_text("{}")
    os.symlink(tmp_path / "host-secret", root / "logs" / "verifier")
    assert lstat_inside(root, "/logs/verifier/reward.json") is None
    assert lstat_inside(root, "/logs/verifier") is not None  # the link itself
