"""The sweep as deployments on a real `prefect server`: run on demand, and on a schedule."""

import json
import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deployment_helpers import BIN, HTTP, api, api_env, create_flow_run, process_worker, save_backend, wait_for_deployment
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS, EXPECTED_ORACLE_REWARDS

pytestmark = [pytest.mark.slow, pytest.mark.integration]
#: Runs requested at once in the flood test.
FLOOD = 3


def wait_for_terminal_runs(base: str, deployment_id: str, count: int, results: str, ignore: set[str] = frozenset(), timeout: float = 180) -> list[dict]:
    """Finished runs of the deployment that wrote to ``results``, but those in ``ignore`` (earlier runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = HTTP.post(f"{base}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}).json()
        runs = [r for r in runs if r["parameters"].get("results") == results and r["id"] not in ignore]
        done = [r for r in runs if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")]
        if len(done) >= count:
            return done
        time.sleep(1)
    raise AssertionError(f"fewer than {count} finished runs of {deployment_id}: {[(r['name'], r['state_type']) for r in runs]}")


def test_prefect_deployment_run_runs_a_sweep_to_completion(ui_server, served, tmp_path):
    deployment = wait_for_deployment(ui_server, "sweep")
    assert {"dataset", "backend", "backend_block", "results", "storage", "storage_block", "concurrency"} <= set(deployment["parameter_openapi_schema"]["properties"])
    # The same wherever `serve` was started (a file path would be relative to its folder).
    assert deployment["entrypoint"] == "prefect_harbor.flows.sweep.evaluation_sweep"
    run = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "evaluation-sweep/sweep", "--param", f"dataset={EXAMPLE_DATASET}",
         "--param", "backend_block=deploy-examples", "--param", f"results={tmp_path / 'on-demand'}", "--watch"],
        env=served, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # What the README promises --watch shows: the headline among the run's lines, and the counts at its end.
    shown = " ".join(run.stdout.split())  # as printed, wrapped to the console's width
    assert "7 rows: 7 success, 0 failure, 0 cancelled; mean reward 0.857 over 7 rows (95% CI 0.487 to 0.974) — results at" in shown, run.stdout[-3000:]
    assert shown.endswith("Flow run finished successfully in '6/7 rewarded, mean 0.857'."), run.stdout[-500:]
    (results,) = (tmp_path / "on-demand").glob("*/results.parquet")
    assert pq.read_table(results).num_rows == len(EXPECTED_ORACLE_REWARDS)


@pytest.mark.timeout(480)
def test_a_flood_of_deployment_runs_queues_behind_the_concurrency_limit(ui_server, served, tmp_path):
    """Runs of the deployment requested at once: the ENQUEUE limit of 1 runs them one at a time, all to completion."""
    deployment = wait_for_deployment(ui_server, "sweep")
    results = str(tmp_path / "flood")
    dataset = tmp_path / "one-row.jsonl"
    dataset.write_text(json.dumps({"id": "words", "metadata": {"harbor_task_id": "reward-txt"}}) + "\n")
    parameters = {"dataset": str(dataset), "backend_block": "deploy-examples", "results": results, "prewarm": False}
    for _ in range(FLOOD):  # what `prefect deployment run` sends, without paying a CLI start-up per call
        response = create_flow_run(ui_server, deployment["id"], parameters)
        assert response.status_code == 201, response.text
    most_running, deadline = 0, time.monotonic() + 420
    while time.monotonic() < deadline:
        runs = HTTP.post(f"{ui_server}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment["id"]]}}}).json()
        runs = [r for r in runs if r["parameters"].get("results") == results]
        most_running = max(most_running, sum(r["state_type"] == "RUNNING" for r in runs))
        if len(runs) == FLOOD and all(r["state_type"] == "COMPLETED" for r in runs):
            break
        time.sleep(0.25)
    assert [r["state_type"] for r in runs] == ["COMPLETED"] * FLOOD, [(r["name"], r["state_type"]) for r in runs]
    assert most_running == 1
    assert len(list((tmp_path / "flood").glob("*/results.parquet"))) == FLOOD


def test_the_prewarm_deployment_reports_each_task(ui_server, served, tmp_path):
    wait_for_deployment(ui_server, "prewarm", flow="prewarm")
    run = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "prewarm/prewarm", "--param", "backend_block=deploy-examples",
         "--param", 'task_ids=["reward-txt", "no-network"]', "--watch"],
        env=served, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0 and "COMPLETED" in run.stdout.upper(), run.stdout[-2000:] + run.stderr[-2000:]


def test_the_scheduled_sweep_fires(ui_server, served, serve_process):
    # The shared serve keeps the nightly schedule paused between tests: let it fire here.
    with serve_process.nightly_resumed() as (deployment, earlier):
        assert deployment["schedules"], "the nightly deployment has no schedule"
        runs = wait_for_terminal_runs(ui_server, deployment["id"], count=1, results=serve_process.nightly_results, ignore=earlier)
    assert runs[0]["state_type"] == "COMPLETED", json.dumps(runs[0])[:2000]
    assert list(Path(serve_process.nightly_results).glob(f"*-{runs[0]['id'][:8]}/results.parquet"))


def test_a_deployment_sweep_says_what_changed_since_the_deployments_previous_sweep(ui_server, served, tmp_path):
    """Two runs of the `sweep` deployment over the same dataset, the second with one task broken: the second
    compares itself with the first, in its headline, its report artifact and summary.json."""
    from tasks_factory import write_task

    for variant, flips in (("before", "echo 1 > /logs/verifier/reward.txt"), ("after", "echo 0 > /logs/verifier/reward.txt")):
        write_task(tmp_path / variant, "steady")
        write_task(tmp_path / variant, "flips", test=flips)
        save_backend(served, f"compare-{variant}", tmp_path / variant, trials_dir=str(tmp_path / "trials"))
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "metadata": {"harbor_task_id": t}}) + "\n" for i, t in [("s", "steady"), ("f", "flips")]))
    results = tmp_path / "compared"
    wait_for_deployment(ui_server, "sweep")
    for variant in ("before", "after"):
        run = subprocess.run(
            [str(BIN / "prefect"), "deployment", "run", "evaluation-sweep/sweep", "--param", f"dataset={dataset}",
             "--param", f"backend_block=compare-{variant}", "--param", f"results={results}", "--watch"],
            env=served, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    first, second = sorted(results.iterdir())
    assert json.loads((first / "summary.json").read_text())["comparison"] is None, "nothing before the first"
    summary = json.loads((second / "summary.json").read_text())
    comparison = summary["comparison"]
    assert comparison["baseline"] == f"file://{first}" and comparison["per_task"]["flips"]["difference"]["mean"] == -1.0
    baseline = json.loads((first / "manifest.json").read_text())
    assert baseline["flow_run_name"], "the manifest keeps the flow run's name"
    phrase = f"1 task lower than run '{baseline['flow_run_name']}' ({baseline['run_id']}) of {baseline['started_at'][:10]}: flips −1 (p=1, could be chance)"
    flow_run_id = json.loads((second / "manifest.json").read_text())["flow_run_id"]
    assert phrase in HTTP.get(f"{ui_server}/api/flow_runs/{flow_run_id}").json()["state"]["message"]
    artifacts = api("post", f"{ui_server}/api/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": ["evaluation-sweep-report"]}}}).json()
    assert artifacts and "Compared with this deployment's previous sweep" in artifacts[0]["data"] and phrase in artifacts[0]["data"]


def cancel_a_running_sweep(base: str, env: dict, tmp_path: Path, name: str, sandbox_deadline: float) -> tuple[float, float]:
    """Start the `sweep` deployment on two slow rows and three queued ones, cancel it with
    `prefect flow-run cancel` once both slow trials run; check every row ends `cancelled`, and
    that the run ends with the sweep's headline although its runner forces a Cancelled state of its own.

    Returns seconds from the cancel request to the last sandbox gone and to CANCELLED.
    """
    from tasks_factory import slow_and_queued
    from test_cancellation import marked_processes

    marker = f"cancel-{name}-{os.getpid()}"
    dataset = slow_and_queued(tmp_path, marker)
    save_backend(env, f"{name}-slow", tmp_path / "tasks", n_concurrent=2, trials_dir=str(tmp_path / "trials"))
    wait_for_deployment(base, "sweep")
    started = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "evaluation-sweep/sweep", "--param", f"dataset={dataset}",
         "--param", f"backend_block={name}-slow", "--param", f"results={tmp_path / 'results'}"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    flow_run_id = next(line.split()[-1] for line in started.stdout.splitlines() if "UUID" in line)
    deadline = time.monotonic() + 180
    while len(marked_processes(marker)) < 2:
        assert time.monotonic() < deadline, "the slow trials never started"
        time.sleep(0.2)
    requested = time.monotonic()
    subprocess.run([str(BIN / "prefect"), "flow-run", "cancel", flow_run_id], env=env, check=True, capture_output=True)
    while marked_processes(marker):
        assert time.monotonic() - requested < sandbox_deadline, "sandboxes survived the cancellation"
        time.sleep(0.1)
    gone_after = time.monotonic() - requested
    while (state := HTTP.get(f"{base}/api/flow_runs/{flow_run_id}").json()["state_type"]) != "CANCELLED":
        assert time.monotonic() - requested < 90, state
        time.sleep(0.5)
    cancelled_after = time.monotonic() - requested
    (results,) = (tmp_path / "results").glob("*/results.parquet")
    assert pq.read_table(results).column("status").to_pylist() == ["cancelled"] * 5
    final = wait_for_the_headline(base, flow_run_id)
    assert (final["type"], final["name"]) == ("CANCELLED", "0/5 rewarded, 5 cancelled")
    logs = HTTP.post(f"{base}/api/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}, "timestamp": {"after_": final["timestamp"]}}}).json()
    assert not [log["message"] for log in logs if "Downloading flow code" in log["message"]]
    return gone_after, cancelled_after


def wait_for_the_headline(base: str, flow_run_id: str, timeout: float = 120) -> dict:
    """The run's final state once its runner's own Cancelled state came and the sweep's headline is back (and stayed)."""
    deadline = time.monotonic() + timeout
    while True:
        states = sorted(HTTP.get(f"{base}/api/flow_run_states/", params={"flow_run_id": flow_run_id}).json(), key=lambda s: s["timestamp"])
        runners = any(s["message"] == "Flow run was cancelled successfully." for s in states)
        if runners and (states[-1]["message"] or "").startswith("Sweep cancelled ("):
            break
        assert time.monotonic() < deadline, [(s["type"], s["name"], (s["message"] or "")[:80]) for s in states]
        time.sleep(0.5)
    time.sleep(3)
    after = HTTP.get(f"{base}/api/flow_runs/{flow_run_id}").json()["state"]
    assert after["id"] == states[-1]["id"], f"the headline did not stay: {after['message']}"
    return after


def test_cancelling_a_served_run_stops_its_trials_within_the_grace_period(ui_server, served, tmp_path):
    """serve() SIGTERMs the flow process and SIGKILLs it 30 s later; the sweep must be done well before."""
    gone, cancelled = cancel_a_running_sweep(ui_server, served, tmp_path, "served", sandbox_deadline=25)
    print(f"served run: cancel -> sandboxes gone {gone:.2f} s, -> CANCELLED {cancelled:.2f} s")


@pytest.fixture(scope="module")
def worker(ui_server, serve_process, tmp_path_factory):
    """The prefect.yaml deployments on a process work pool, and a worker polling it (shared by the
    worker tests, which conftest runs last: the worker takes the deployment names serve served).

    Its environment's TMPDIR holds the worker's log.
    """
    serve_process.stop()
    tmp_path = tmp_path_factory.mktemp("worker")
    with process_worker(api_env(ui_server, tmp_path), tmp_path) as env:
        yield env


def test_a_process_worker_runs_the_prefect_yaml_deployment(worker, tmp_path):
    save_backend(worker, "examples-oracle", EXAMPLE_TASKS)
    run = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "evaluation-sweep/sweep", "--param", f"dataset={EXAMPLE_DATASET}",
         "--param", "backend_block=examples-oracle", "--param", f"results={tmp_path / 'by-worker'}", "--watch"],
        env=worker, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + (Path(worker["TMPDIR"]) / "worker.log").read_text()[-3000:]
    assert list((tmp_path / "by-worker").glob("*/results.parquet"))


def test_cancelling_a_worker_run_stops_its_trials(ui_server, worker, tmp_path):
    gone, cancelled = cancel_a_running_sweep(ui_server, worker, tmp_path, "worker", sandbox_deadline=60)
    print(f"worker run: cancel -> sandboxes gone {gone:.2f} s, -> CANCELLED {cancelled:.2f} s")
