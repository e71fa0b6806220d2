"""What the Prefect UI says about rows and sweeps: state names, log lines, tables, rounding."""

import logging

import pytest

from prefect_harbor.flows.configuration import CancelledIsNotAnError
from prefect_harbor.flows.headline import SWEEP_CANCELLED, own_final_state
from prefect_harbor.outcome import Counts, figure, row_line, state_name, table_row
from prefect_harbor.secrets import Redactor
from prefect_harbor.storage.results import RowResult, RunTally
from prefect_harbor.tasks.trial import outcome_state
from prefect_harbor.trial.outcome import verifier_output


def row(index: int = 0, status: str = "success", reward: float | None = 1.0, **fields) -> RowResult:
    return RowResult(row_index=index, row_id=f"r{index}", task="t", status=status, reward=reward, **fields)


@pytest.mark.parametrize(
    ("result", "name", "state_type"),
    [
        (row(reward=1.0), "Reward 1", "COMPLETED"),
        (row(reward=0.5), "Reward 0.5", "COMPLETED"),
        (row(reward=0.8571428571428571), "Reward 0.857", "COMPLETED"),
        (row(reward=0.0), "Reward 0", "COMPLETED"),
        (row(status="failure", reward=None, err_category="verifier_error", err_message="RewardFileNotFoundError"), "Verifier error", "FAILED"),
        (row(status="failure", reward=None, err_category="timeout", err_message="AgentTimeoutError"), "Timeout", "FAILED"),
        (row(status="failure", reward=None, err_category="validation_error", err_message="unknown harbor task id"), "Validation error", "FAILED"),
        (row(status="cancelled", reward=None, err_message="cancelled while running"), "Cancelled", "CANCELLED"),
    ],
)
def test_a_rows_task_run_is_named_after_its_outcome(result, name, state_type):
    state = outcome_state([result])
    assert (state.name, state.type.value) == (name, state_type)
    assert state_name(result) == name


def test_a_task_run_of_several_rows_names_their_counts_and_takes_the_worst_type():
    rows = [row(0, reward=1.0), row(1, reward=0.0), row(2, reward=0.5), row(3, status="failure", reward=None, err_category="agent_error")]
    state = outcome_state(rows)
    assert state.type.value == "FAILED"
    assert state.name == "2/4 rewarded, 1 failed, mean 0.5"
    assert state.message == "4 rows: 3 success, 1 failure; mean reward 0.5"
    assert outcome_state([row(0), row(1, status="cancelled", reward=None)]).name == "1/2 rewarded, 1 cancelled, mean 1"
    assert Counts.of([row(0, status="cancelled", reward=None)]).name() == "0/1 rewarded, 1 cancelled"


def test_the_sweeps_counts_name_its_final_state():
    tally = RunTally()
    for result in [row(0, reward=1.0), row(1, reward=0.0), row(2, reward=1.0), row(3, status="failure", reward=None, err_category="timeout")]:
        tally.add(result)
    summary = tally.summary("run", "file:///r/results.parquet")
    # The agent's timeout counts as 0 (the scoring contract), and the headline says so.
    assert summary.counts().name() == "2/4 rewarded, 1 failed, mean 0.5"
    assert summary.headline().startswith("4 rows: 3 success, 1 failure, 0 cancelled; mean reward 0.5 over 4 rows, 1 agent failure counted as 0 — results at")


def test_a_mean_says_which_attempts_it_counts_and_what_it_left_out():
    """The issue's run: 6 attempts, 2 rewarded of 3 scored, 2 agent failures (as 0), 1 sandbox failure (left out)."""
    tally = RunTally()
    attempts = [
        row(0, reward=1.0), row(1, reward=1.0), row(2, reward=0.0),
        row(3, status="failure", reward=None, err_category="agent_error", failure_cause="unclassified", err_phase="agent"),
        row(4, status="failure", reward=None, err_category="timeout", failure_cause="agent_exhausted_budget", err_phase="agent"),
        row(5, status="failure", reward=None, err_category="timeout", failure_cause="sandbox_failed", err_phase="environment_setup"),
    ]  # fmt: skip
    for result in attempts:
        tally.add(result)
    summary = tally.summary("run", "file:///r/results.parquet")
    assert (summary.mean_reward, summary.scored, summary.agent_failures, summary.not_scored) == (0.4, 3, 2, {"sandbox": 1})
    assert summary.headline().startswith(
        "6 rows: 3 success, 3 failure, 0 cancelled; mean reward 0.4 over 5 rows, 2 agent failures counted as 0; 1 not scored (sandbox 1) — results at"
    )


def test_figures_are_rounded_for_people_and_kept_whole_in_the_row():
    assert (figure(0.8571428571428571), figure(1.0), figure(12.3456), figure(None)) == ("0.857", "1", "12.3", "-")
    result = row(reward=0.8571428571428571, artifact_uri="file:///r/archives/r0")
    assert table_row(result) == {
        "row": "r0", "task": "t", "status": "success", "reward": 0.857, "category": None, "archive": "file:///r/archives/r0", "message": None,
    }  # fmt: skip
    assert result.reward == 0.8571428571428571


def test_a_rows_log_line_has_its_outcome_timings_and_archive():
    result = row(reward=0.0, environment_setup_sec=1.23, agent_setup_sec=0.0, agent_sec=2.5, verifier_sec=0.71, total_sec=4.6, artifact_uri="file:///r/archives/r0")
    assert row_line(result) == (
        "Row r0 (t): success, reward 0; environment 1.2 s, agent setup 0.0 s, agent 2.5 s, verifier 0.7 s, total 4.6 s; archive file:///r/archives/r0"
    )
    failed = row(status="failure", reward=None, err_category="validation_error", err_message="unknown harbor task id 'x'")
    assert row_line(failed) == "Row r0 (t): failure, validation_error: unknown harbor task id 'x'; no timings; archive -"
    assert row_line(row(status="cancelled", reward=None, err_message="cancelled while running")).startswith("Row r0 (t): cancelled: cancelled while running;")
    assert row_line(row(reward=1.0, attempt=2)).startswith("Row r0 #2 (t): success, reward 1;"), "a later attempt is named as its task run is"


def test_the_verifiers_last_lines_are_bounded_and_redacted_even_across_the_cut(tmp_path):
    secret = "sk-test-0123456789abcdef"
    (tmp_path / "verifier").mkdir()
    # The secret straddles the start of the last 4 KiB: read alone, the window would hold only its tail.
    ending = "\nlast line\n"
    text = "x" * 10_000 + "\n" + secret + "y" * (4096 - len(secret) // 2 - len(ending)) + ending
    (tmp_path / "verifier" / "test-stdout.txt").write_text(text)
    raw_window = text.encode()[-4096:].decode()
    assert secret[-8:] in raw_window and secret not in raw_window, "the test's secret must straddle the window's start"
    tail = verifier_output(tmp_path, Redactor.of([secret]), lines=30, max_bytes=4096)
    assert len(tail.encode()) <= 4096 and tail.endswith("last line")
    assert secret[-8:] not in tail
    assert verifier_output(tmp_path / "nowhere") == ""


def test_an_intended_cancel_is_logged_at_info_and_a_failure_stays_an_error():
    rule = CancelledIsNotAnError()

    def level_of(message: str) -> str:
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, message, None, None)
        rule.filter(record)
        return record.levelname

    assert level_of("Finished in state Cancelled('cancelled while running; archive …')") == "INFO"
    assert level_of("Finished in state 0/5 rewarded, 5 cancelled('Sweep cancelled (received SIGTERM); …', type=CANCELLED)") == "INFO"
    assert level_of("Finished in state Validation error(\"validation_error: unknown harbor task id 'x'\", type=FAILED)") == "ERROR"


def test_the_headline_keeper_finds_the_sweeps_own_state_since_it_last_ran():
    from prefect.states import Cancelled, Cancelling, Running

    own = Cancelled(name="0/5 rewarded, 5 cancelled", message=f"{SWEEP_CANCELLED} (received SIGTERM); 5 rows: …")
    runners = Cancelled(message="Flow run was cancelled successfully.")
    assert own_final_state([Running(), Cancelling(), own, runners]) is own
    assert own_final_state([Running(), Cancelling(), runners]) is None, "killed before it set its own: nothing to keep"
    assert own_final_state([own, runners, Running(), Cancelling(), runners]) is None, "a retry's run: the old headline is not this one's"
