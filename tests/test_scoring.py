"""The scoring contract: which attempts a mean counts, and the same mean in the summary, the statistics and Harbor's job."""

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from prefect_harbor.scoring import counted_value, scoring_of
from prefect_harbor.stats.summary import summarize
from prefect_harbor.storage.results import RowResult, RunTally, to_table


def failed(**fields) -> dict:
    return {"status": "failure", "reward": None} | fields


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"status": "success", "reward": 0.0}, ("scored", None)),
        ({"status": "failure", "reward": 1.0, "err_category": "verifier_tampering"}, ("scored", None)),  # flagged, kept: scored
        ({"status": "cancelled", "reward": None}, ("cancelled", None)),
        (failed(err_category="agent_error", failure_cause="unclassified", err_phase="agent"), ("agent_failure", None)),  # the agent's command failed
        (failed(err_category="timeout", failure_cause="agent_exhausted_budget", err_phase="agent"), ("agent_failure", None)),
        (failed(err_category="agent_error", err_phase="agent"), ("agent_failure", None)),  # a workflow that reported failure
        (failed(err_category="validation_error", err_phase="grading", err_message="No sample to grade: the workflow returned no messages"), ("agent_failure", None)),
        (failed(err_category="verifier_tampering", err_phase="verifier"), ("agent_failure", None)),  # on_tampering = "fail"
        (failed(err_category="timeout", failure_cause="sandbox_failed", err_phase="environment_setup"), ("not_scored", "sandbox")),
        (failed(err_category="agent_error", failure_cause="model_provider_failed", err_phase="agent"), ("not_scored", "model_endpoint")),
        (failed(err_category="agent_error", failure_cause="harbor_failed"), ("not_scored", "sweep")),  # the sweep's own failure
        (failed(err_category="timeout", failure_cause="verifier_failed", err_phase="verifier", verifier_mode="separate"), ("not_scored", "verifier")),
        (failed(err_category="validation_error", err_phase="setup", err_message="unknown harbor task id 'x'"), ("not_scored", "setup")),
        (failed(err_category="agent_error", failure_cause="unclassified", err_phase="environment_setup"), ("not_scored", "sandbox")),
        (failed(err_category="agent_error", failure_cause="unclassified", err_phase="agent_setup"), ("not_scored", "agent_setup")),
        (failed(err_category="verifier_error", err_phase="verifier", verifier_mode="separate"), ("not_scored", "verifier")),
        (failed(err_category="validation_error", err_phase="grading", err_message="Sample has no reward after grading", verifier_mode="separate"), ("not_scored", "grading")),
        (failed(err_category="timeout", failure_cause="sandbox_failed", err_phase="verifier", verifier_mode="separate"), ("not_scored", "sandbox")),  # its own
        # Within the agent's reach: a sandbox that failed once the agent ran, a verifier or grader sharing that sandbox.
        (failed(err_category="agent_error", failure_cause="sandbox_failed", err_phase="agent", verifier_mode="separate"), ("agent_failure", None)),
        (failed(err_category="timeout", failure_cause="verifier_failed", err_phase="verifier", verifier_mode="shared"), ("agent_failure", None)),
        (failed(err_category="verifier_error", err_phase="verifier", verifier_mode="shared"), ("agent_failure", None)),
        (failed(err_category="verifier_error", err_phase="verifier"), ("agent_failure", None)),  # a multi-step trial's: shared unless said
        (failed(err_category="validation_error", err_phase="grading", err_message="Sample has no reward after grading", verifier_mode="shared"), ("agent_failure", None)),
        (failed(err_category="agent_error", failure_cause="sandbox_failed", err_phase="verifier", verifier_mode="shared"), ("agent_failure", None)),
        (failed(), ("not_scored", "unknown")),
    ],
)
def test_each_attempt_is_scored_an_agent_failure_not_scored_or_cancelled(record, expected):
    assert scoring_of(record) == expected
    assert counted_value(record) == {"scored": record["reward"], "agent_failure": 0.0}.get(expected[0])


ATTEMPTS = [
    RowResult(row_index=0, row_id="a", task="t", agent="oracle", status="success", reward=1.0, rewards={"reward": 1.0}, trial_name="a1"),
    RowResult(row_index=1, row_id="b", task="t", agent="oracle", status="success", reward=0.0, rewards={"reward": 0.0}, trial_name="b1"),
    RowResult(row_index=2, row_id="c", task="t", agent="oracle", status="failure", err_category="agent_error", failure_cause="unclassified", err_phase="agent", trial_name="c1"),
    RowResult(
        row_index=3, row_id="d", task="t", agent="oracle", status="failure", err_category="timeout", failure_cause="sandbox_failed", err_phase="environment_setup",
        trial_name="d1",
    ),
    RowResult(row_index=4, row_id="e", task="t", agent="oracle", status="cancelled", trial_name="e1"),
]  # fmt: skip


def test_the_summary_the_statistics_and_harbors_job_mean_agree():
    from prefect_harbor.storage.harbor_job import finished_job
    from prefect_harbor.storage.manifest import RunManifest

    tally = RunTally()
    for attempt in ATTEMPTS:
        tally.add(attempt)
    summary = tally.summary("run", "file:///r/results.parquet")
    table = to_table(ATTEMPTS)
    statistics = summarize(table.to_pylist())
    assert summary.mean_reward == statistics.reward.mean == pytest.approx(1 / 3)  # 1, 0 and the agent's failure as 0
    assert (statistics.scored, statistics.agent_failures, statistics.not_scored) == (2, 1, {"sandbox": 1})
    finished = datetime(2026, 12, 4, tzinfo=UTC)
    manifest = RunManifest.model_construct(run_id="run", flow_run_id=None, started_at=finished, finished_at=finished)  # what the job reads of it
    job = finished_job(manifest, table, attempts=1)
    (evals,) = job.stats.evals.values()
    assert evals.metrics == [{"mean": pytest.approx(1 / 3)}], "Harbor's viewer shows the same mean as the sweep"


def test_compare_counts_a_rows_agent_failure_as_0_as_the_runs_mean_does():
    from prefect_harbor.stats.compare import compare_tables

    before = to_table([RowResult(row_index=0, row_id="c", task="t", status="success", reward=1.0)])
    after = to_table([ATTEMPTS[2]])
    comparison = compare_tables(before, after, "A", "B")
    assert comparison.difference.difference.mean == -1.0, "an agent that crashed did worse than one that scored 1"
    assert compare_tables(before, to_table([ATTEMPTS[3]]), "A", "B").paired_rows == 0, "a sandbox failure measured nothing"


def test_an_old_results_table_without_the_contracts_columns_still_summarizes():
    old = pa.table({"row_id": ["a", "b"], "status": ["success", "failure"], "reward": [1.0, None]})
    from prefect_harbor.stats.summary import summarize_table

    statistics = summarize_table(old)
    assert (statistics.scored, statistics.agent_failures, statistics.not_scored) == (1, 0, {"unknown": 1})


def test_a_run_with_nothing_counted_has_a_harbor_job_without_a_mean():
    """Every attempt not scored (a prewarm that failed): no mean, and the job's result.json is still written."""
    from prefect_harbor.storage.harbor_job import finished_job
    from prefect_harbor.storage.manifest import RunManifest

    finished = datetime(2026, 12, 4, tzinfo=UTC)
    manifest = RunManifest.model_construct(run_id="run", flow_run_id=None, started_at=finished, finished_at=finished)
    job = finished_job(manifest, to_table([ATTEMPTS[3], ATTEMPTS[4]]), attempts=1)
    (evals,) = job.stats.evals.values()
    assert evals.metrics == [] and job.stats.n_errored_trials == 2
