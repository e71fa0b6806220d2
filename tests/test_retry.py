"""Which not-scored attempts are tried again, after how long, and where the failed try's trial goes."""

from __future__ import annotations

import pytest

from prefect_harbor.scoring import worth_retrying
from prefect_harbor.spec import Limits
from prefect_harbor.storage.results import RowResult
from prefect_harbor.trial.retry import MAX_WAIT_SEC, retry_line, retry_wait, set_aside

SANDBOX = {"status": "failure", "err_category": "timeout", "err_phase": "environment_setup", "exception_type": "EnvironmentStartTimeoutError", "failure_cause": "sandbox_failed"}
MODEL_DOWN = {"status": "failure", "err_category": "agent_error", "exception_type": "ApiConnectionError", "failure_cause": "model_provider_failed"}
KEY_REFUSED = {"status": "failure", "err_category": "agent_error", "exception_type": "AgentAuthenticationError", "failure_cause": "model_provider_failed"}
VERIFIER = {
    "status": "failure", "err_category": "verifier_error", "err_phase": "verifier", "exception_type": "RewardFileNotFoundError", "failure_cause": "verifier_failed",
    "verifier_mode": "separate",
}  # fmt: skip
BAD_ROW = {"status": "failure", "err_category": "validation_error", "err_phase": "setup", "err_message": "unknown task"}
AGENT_TIMEOUT = {"status": "failure", "err_category": "timeout", "err_phase": "agent", "exception_type": "AgentTimeoutError", "failure_cause": "agent_exhausted_budget"}
SCORED_ZERO = {"status": "success", "reward": 0.0}


def result(fields: dict, **more) -> RowResult:
    return RowResult(row_index=0, row_id="r", task="t", **{**fields, **more})


@pytest.mark.parametrize(
    ("fields", "retried"),
    [(SANDBOX, True), (MODEL_DOWN, True), (KEY_REFUSED, False), (VERIFIER, False), (BAD_ROW, False), (AGENT_TIMEOUT, False), (SCORED_ZERO, False)],
    ids=["sandbox", "model-endpoint-away", "model-key-refused", "verifier", "bad-row", "agent-timeout", "scored-zero"],
)
def test_only_a_not_scored_attempt_whose_cause_may_pass_is_tried_again(fields, retried):
    assert worth_retrying(result(fields).model_dump()) is retried


def test_the_wait_doubles_and_the_tries_stop_at_the_backends_limit():
    limits = Limits(not_scored_retries=3, retry_wait_sec=5)
    assert [retry_wait(result(SANDBOX), tries, limits) for tries in (1, 2, 3, 4)] == [5, 10, 20, None]
    assert retry_wait(result(SANDBOX), 1, Limits(not_scored_retries=0)) is None
    assert retry_wait(result(SANDBOX), 10, Limits(not_scored_retries=10, retry_wait_sec=600)) == MAX_WAIT_SEC
    assert retry_wait(result(VERIFIER), 1, limits) is None


def test_a_failed_try_leaves_its_trial_beside_the_next_and_its_task_copy_goes(tmp_path):
    trial, task_copy = tmp_path / "trials" / "r__abc", tmp_path / "tasks" / "r__abc"
    (trial / "agent").mkdir(parents=True)
    (trial / "trial.log").write_text("the sandbox did not start\n")
    (task_copy / "tests").mkdir(parents=True)
    failed = result(SANDBOX, trial_dir=str(trial), err_message="the container did not start in 60 s")

    kept = set_aside(failed, 1, task_copy)

    assert kept == tmp_path / "trials" / "r__abc.try1" and (kept / "trial.log").read_text() == "the sandbox did not start\n"
    assert not trial.exists() and not task_copy.exists()
    line = retry_line(failed, 1, 5.0, Limits(), kept)
    assert line == f"Row r: not scored (sandbox: the container did not start in 60 s); trying it again in 5 s (try 2 of at most 3); its trial is kept at {kept}"
    assert set_aside(result(BAD_ROW), 1, task_copy) is None, "a try that never reached a trial leaves nothing to keep"
