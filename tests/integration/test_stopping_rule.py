"""A sweep with a stopping rule (``stop_at_ci_width``) runs its attempts in rounds and stops once
the mean's interval is narrow enough, through the flow on a real server. The trials are stand-ins
(no sandbox) whose rewards are fixed by row and attempt, so each round's interval is known."""

import asyncio
import json
from collections import Counter

import pyarrow.parquet as pq
import pytest
from tasks_factory import write_task

import prefect_harbor.tasks.trial
from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.stats.estimators import clustered_mean
from prefect_harbor.trial.row_trial import base_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(300)]

ROWS = 12


def reward(index: int, attempt: int) -> float:
    """A spread of 0s and 1s within and across rows: the interval narrows with each round."""
    return float((index * 7 + attempt * 3) % 5 < 3)


def width_after(rounds: int) -> float:
    low, high = clustered_mean([[reward(i, a) for a in range(1, rounds + 1)] for i in range(ROWS)]).ci95
    return high - low


@pytest.fixture
def stand_in_trials(tmp_path, monkeypatch) -> Counter[int]:
    """How many trials ran of each attempt number."""
    write_task(tmp_path / "tasks", "t")
    ran: Counter[int] = Counter()

    async def run_row(row, index, trial_name, backend, resolver, run, *rest, **options):
        attempt = options.get("attempt", rest[2] if len(rest) > 2 else 1)
        ran[attempt] += 1
        base = base_result(row, index, backend, attempt).model_copy(update={"trial_name": trial_name})
        return base.model_copy(update={"status": "success", "reward": reward(index, attempt), "err_phase": None})

    monkeypatch.setattr(prefect_harbor.tasks.trial, "run_row", run_row)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "metadata": {"harbor_task_id": "t"}}) + "\n" for i in range(ROWS)))
    return ran


def backend(tmp_path, **options) -> HarborBackend:
    return HarborBackend(tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=3, **options)


async def test_the_sweep_stops_after_the_round_whose_interval_is_narrow_enough(tmp_path, stand_in_trials):
    target = 0.35
    assert width_after(2) > target >= width_after(3), "the rewards must make round 3 the first narrow one"

    summary = await evaluation_sweep(
        dataset=str(tmp_path / "rows.jsonl"), backend=backend(tmp_path, attempts=4), stop_at_ci_width=target, results=str(tmp_path / "results"), prewarm=False
    )

    assert dict(stand_in_trials) == {1: ROWS, 2: ROWS, 3: ROWS}, "round 4 never started"
    table = pq.read_table(summary.results_uri).to_pylist()
    assert sorted((r["row_id"], r["attempt"]) for r in table) == sorted((f"r{i}", a) for i in range(ROWS) for a in (1, 2, 3))
    assert {r["status"] for r in table} == {"success"}, "the attempts it did not need are not recorded as cancelled"
    assert summary.attempts == 3 and summary.statistics.attempts == 3
    low, high = summary.statistics.reward.ci95
    assert high - low == pytest.approx(width_after(3)) and high - low <= target
    assert summary.stopped_early.startswith("stopped after 3 of at most 4 attempts per row: the mean's 95% interval is 0.307 wide")
    assert summary.stopped_early in summary.headline()
    written = json.loads((tmp_path / "results" / summary.run_id / "summary.json").read_text())
    assert written["stopped_early"] == summary.stopped_early and written["attempts"] == 3
    status = json.loads((tmp_path / "results" / summary.run_id / "status.json").read_text())
    assert "queued" not in status["counts"] and status["rows"] == {f"r{i}": "success" for i in range(ROWS)}


async def test_a_sweep_whose_interval_never_gets_narrow_enough_spends_its_attempts(tmp_path, stand_in_trials):
    summary = await evaluation_sweep(
        dataset=str(tmp_path / "rows.jsonl"), backend=backend(tmp_path, attempts=3, stop_at_ci_width=0.01), results=str(tmp_path / "results"), prewarm=False
    )

    assert dict(stand_in_trials) == {1: ROWS, 2: ROWS, 3: ROWS}
    assert summary.attempts == 3 and summary.stopped_early is None and (summary.rows, summary.trials) == (ROWS, 3 * ROWS)


async def test_a_stopping_rule_on_several_hosts_is_refused_before_any_trial(tmp_path, stand_in_trials):
    with pytest.raises(Exception, match="stop_at_ci_width: the stopping rule decides over every row after each round, on one host"):
        await evaluation_sweep(
            dataset=str(tmp_path / "rows.jsonl"), backend=backend(tmp_path, attempts=3, stop_at_ci_width=0.1), shards=2, results=str(tmp_path / "results"),
            prewarm=False,
        )  # fmt: skip
    assert not stand_in_trials


async def test_a_sweep_cancelled_mid_round_records_every_later_attempt_cancelled(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run
    from prefect.states import Cancelling

    write_task(tmp_path / "tasks", "t")
    ran: Counter[int] = Counter()

    async def run_row(row, index, trial_name, backend, resolver, run, *rest, **options):
        attempt = options.get("attempt", rest[2] if len(rest) > 2 else 1)
        ran[attempt] += 1
        if attempt == 2 and index == 0:  # round 2's first trial cancels the run, and runs until it is stopped
            async with get_client() as client:
                await client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            await asyncio.Event().wait()
        base = base_result(row, index, backend, attempt).model_copy(update={"trial_name": trial_name})
        return base.model_copy(update={"status": "success", "reward": reward(index, attempt), "err_phase": None})

    monkeypatch.setattr(prefect_harbor.tasks.trial, "run_row", run_row)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "metadata": {"harbor_task_id": "t"}}) + "\n" for i in range(ROWS)))

    state = await evaluation_sweep(
        dataset=str(tmp_path / "rows.jsonl"), backend=backend(tmp_path, attempts=4, stop_at_ci_width=0.01), results=str(tmp_path / "results"),
        prewarm=False, return_state=True,
    )  # fmt: skip

    assert state.is_cancelled()
    assert ran[1] == ROWS and ran[3] == ran[4] == 0
    (results,) = (tmp_path / "results").glob("*/results.parquet")
    table = pq.read_table(results).to_pylist()
    assert sorted((r["row_id"], r["attempt"]) for r in table) == sorted((f"r{i}", a) for i in range(ROWS) for a in range(1, 5)), "every attempt once"
    statuses = {(r["row_id"], r["attempt"]): r["status"] for r in table}
    assert {statuses[f"r{i}", 1] for i in range(ROWS)} == {"success"}
    assert statuses["r0", 2] == "cancelled" and {statuses[f"r{i}", a] for i in range(ROWS) for a in (3, 4)} == {"cancelled"}
