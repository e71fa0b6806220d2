"""Attempts: each row run k times, each attempt a unit of its own (trial, result row, archive, status, resume), through the flow on a real server."""

import asyncio
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.states import Cancelling
from prefect_reads import task_runs_of
from tasks_factory import write_task
from test_cancellation import cli, marked_processes, running_sweep_of, running_sweep_of_id, wait_for

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.stats.estimators import pass_at_k

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

#: A verifier that passes about half the time: attempts of one row differ.
FLAKY = "[ $((RANDOM % 2)) = 0 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"


def rows_file(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": row_id, "metadata": {"harbor_task_id": task}}) + "\n" for row_id, task in rows))
    return path


def backend(tmp_path: Path, **fields) -> HarborBackend:
    return HarborBackend(tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), **fields)


async def test_each_attempt_is_a_trial_with_its_own_result_row_archive_and_status(tmp_path):
    tasks = tmp_path / "tasks"
    write_task(tasks, "passes")
    write_task(tasks, "zero", test="echo 0 > /logs/verifier/reward.txt")
    write_task(tasks, "flaky", test=FLAKY)
    dataset = rows_file(tmp_path / "rows.jsonl", [("p", "passes"), ("z", "zero"), ("f", "flaky")])

    summary = await evaluation_sweep(dataset=str(dataset), backend=backend(tmp_path, n_concurrent=3), results=str(tmp_path / "results"), attempts=3)

    run = Path(summary.results_uri.removeprefix("file://")).parent
    table = pq.read_table(run / "results.parquet").to_pylist()
    assert [(r["row_id"], r["attempt"]) for r in table] == [(row, attempt) for row in "pzf" for attempt in (1, 2, 3)], "keyed (row, attempt), in order"
    assert {r["status"] for r in table} == {"success"}
    assert {r["reward"] for r in table if r["row_id"] == "p"} == {1.0} and {r["reward"] for r in table if r["row_id"] == "z"} == {0.0}
    # Each attempt its own Harbor trial, named for it, archived in its own trial folder of the run (Harbor's job layout).
    names = [r["trial_name"] for r in table]
    assert len(set(names)) == 9 and names[1].startswith("p.a2__") and names[0].startswith("p__")
    assert [r["artifact_uri"] for r in table] == [f"file://{run}/{name}" for name in names]
    assert all((run / name / "result.json").is_file() and (run / name / "config.json").is_file() for name in names)

    # The numbers: pass@k over rows, for k = 1 ... 3, as the unbiased estimator gives it on the recorded rewards.
    stats = summary.statistics
    assert (stats.rows, stats.trials, stats.scored, stats.attempts) == (3, 9, 9, 3)
    passes = {row: sum(r["reward"] == 1.0 for r in table if r["row_id"] == row) for row in "pzf"}
    for k in (1, 2, 3):
        assert stats.pass_at_k[k] == pytest.approx(sum(pass_at_k(3, c, k) for c in passes.values()) / 3)
    assert stats.reward.clusters == 3 and "clustered by row" in stats.reward.method and stats.reward.ci95 is not None
    assert summary.headline().startswith(f"9 trials (3 rows × 3 attempts): 9 success, 0 failure, 0 cancelled; mean reward {summary.mean_reward:.3g} over 9 trials (95% CI ")
    assert f"pass@3 {stats.pass_at_k[3]:.3g}" in summary.headline()
    assert json.loads((run / "summary.json").read_text())["statistics"]["pass_at_k"] == {str(k): v for k, v in stats.pass_at_k.items()}
    # The run is a Harbor job: its result counts every attempt.
    job = json.loads((run / "result.json").read_text())
    assert (job["n_total_trials"], job["stats"]["n_completed_trials"], job["stats"]["n_errored_trials"]) == (9, 9, 0)

    # The live status knows every attempt; the UI shows a task run per attempt; prewarm set each task up once.
    status = json.loads((await asyncio.to_thread(cli, "status", str(run), "f", "--json")).stdout)
    assert status["rows"] == {"f": "success"} and status["attempts"] == {"f": {"1": "success", "2": "success", "3": "success"}}
    assert status["counts"] == {"success": 9}
    async with get_client() as client:
        flow_run = await running_sweep_of_id(client, dataset)
        task_runs = [r.name for r in await task_runs_of(client, flow_run)]
    assert sorted(n for n in task_runs if n.startswith("row ")) == sorted(f"row {row} #{a}" for row in "pzf" for a in (1, 2, 3))
    assert len([n for n in task_runs if n.startswith("prewarm ")]) <= 3, "prewarm sets a task up once, not once per attempt"


async def test_resume_and_rerun_failed_work_attempt_by_attempt(tmp_path):
    """A run cancelled while a row's second attempt runs: resume runs only the unfinished attempts, rerun-failed only the failed ones."""
    marker = f"attempts-resume-{os.getpid()}"
    tasks = tmp_path / "tasks"
    write_task(tasks, "quick")
    write_task(tasks, "slow", solve=f"bash -c 'sleep 8 & wait' {marker}")
    dataset = rows_file(tmp_path / "rows.jsonl", [("a", "quick"), ("b", "slow"), ("c", "quick")])
    config = backend(tmp_path, n_concurrent=1, attempts=2, cleanup_successful_trials=False)
    first = asyncio.create_task(evaluation_sweep(dataset=str(dataset), backend=config, results=str(tmp_path / "results"), return_state=True))
    await wait_for(lambda: list((tmp_path / "results").glob("*/status.json")), what="the status file")
    (status_file,) = (tmp_path / "results").glob("*/status.json")
    await wait_for(
        lambda: json.loads(status_file.read_text() or "{}").get("attempts", {}).get("b") == {"1": "success", "2": "running"} and marked_processes(marker),
        timeout=180, what="b's first attempt done and its second running",
    )  # fmt: skip
    run = await running_sweep_of(dataset)
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelling(), force=True)
    assert (await first).is_cancelled()
    folder = status_file.parent
    before = {(r["row_id"], r["attempt"]): r for r in pq.read_table(folder / "results.parquet").to_pylist()}
    assert {key: r["status"] for key, r in before.items()} == {
        ("a", 1): "success", ("a", 2): "success", ("b", 1): "success", ("b", 2): "cancelled", ("c", 1): "cancelled", ("c", 2): "cancelled",
    }  # fmt: skip

    rerun = await evaluation_sweep(dataset=str(dataset), backend=config, results=str(tmp_path / "results"), rerun_failed=str(folder))
    rerun_rows = sorted((r["row_id"], r["attempt"], r["status"]) for r in pq.read_table(rerun.results_uri).to_pylist())
    assert rerun_rows == [("b~rerun", 2, "success"), ("c~rerun", 1, "success"), ("c~rerun", 2, "success")], "only the failed and cancelled attempts"

    dropped = folder / before[("b", 2)]["artifact_uri"].rsplit("/", 1)[-1]
    assert dropped.is_dir()
    resumed = await evaluation_sweep(dataset=str(dataset), backend=config, resume=str(folder))
    after = {(r["row_id"], r["attempt"]): r for r in pq.read_table(resumed.results_uri).to_pylist()}
    assert {key: r["status"] for key, r in after.items()} == dict.fromkeys(before, "success")
    for kept in (("a", 1), ("a", 2), ("b", 1)):
        assert after[kept]["trial_name"] == before[kept]["trial_name"], f"{kept} finished and was run again"
    assert after[("b", 2)]["trial_name"] != before[("b", 2)]["trial_name"]
    assert not dropped.exists(), "the cancelled attempt's archive outlived its result row"
    assert len(list((tmp_path / "trials").glob("*/a__*"))) == 1 and len(list((tmp_path / "trials").glob("*/a.a2__*"))) == 1


async def test_a_partial_cancel_of_a_row_cancels_all_its_attempts(tmp_path):
    marker = f"attempts-cancel-{os.getpid()}"
    tasks = tmp_path / "tasks"
    write_task(tasks, "slow", solve=f"bash -c 'sleep 600 & wait' {marker}")
    write_task(tasks, "quick")
    dataset = rows_file(tmp_path / "rows.jsonl", [("s", "slow"), ("q", "quick")])
    sweep = asyncio.create_task(
        evaluation_sweep(dataset=str(dataset), backend=backend(tmp_path, n_concurrent=2), results=str(tmp_path / "results"), attempts=2, return_state=True)
    )
    await wait_for(lambda: len(marked_processes(marker)) == 2, timeout=180, what="both attempts of s to run")
    (run,) = (tmp_path / "results").glob("*/manifest.json")
    answer = await asyncio.to_thread(cli, "cancel", str(run.parent), "s", "--json")
    assert json.loads(answer.stdout) == {"s": "cancelled_running"}, answer.stderr
    state = await sweep
    assert state.is_completed()
    rows = {(r["row_id"], r["attempt"]): r["status"] for r in pq.read_table(run.parent / "results.parquet").to_pylist()}
    assert rows == {("s", 1): "cancelled", ("s", 2): "cancelled", ("q", 1): "success", ("q", 2): "success"}
    assert marked_processes(marker) == []
