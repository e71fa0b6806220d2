"""A Prefect server with an auth string (the production set-up): refused without it; the CLI, serve and a worker with it.

The server has no authentication by default, so anything that can reach it reads every
block's secrets. One server for the whole test, one one-row oracle sweep per entry point.
"""

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deployment_helpers import BIN, HTTP, SharedServe, api_env, basic_auth, prefect_server, process_worker, save_backend
from paths import EXAMPLE_TASKS

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AUTH_STRING = "harbor:not-a-real-secret"


def one_row(tmp_path: Path) -> str:
    dataset = tmp_path / "one-row.jsonl"
    dataset.write_text(json.dumps({"id": "words", "metadata": {"harbor_task_id": "reward-txt"}}) + "\n")
    return str(dataset)


def run_deployment(env: dict, dataset: str, results: Path, log: Path) -> None:
    """`prefect deployment run evaluation-sweep/sweep --watch`, then the one row's reward."""
    run = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "evaluation-sweep/sweep", "--param", f"dataset={dataset}",
         "--param", "backend_block=deploy-examples", "--param", f"results={results}", "--param", "prewarm=false", "--watch"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:] + log.read_text()[-3000:]
    (table,) = results.glob("*/results.parquet")
    assert pq.read_table(table).column("reward").to_pylist() == [1.0]


@pytest.mark.timeout(600)
def test_cli_serve_and_a_worker_work_with_the_servers_auth_string(tmp_path):
    with prefect_server(tmp_path / "server", {"PREFECT_SERVER_API_AUTH_STRING": AUTH_STRING}) as base:
        assert HTTP.post(f"{base}/api/block_documents/filter", json={}).status_code == 401
        assert HTTP.post(f"{base}/api/block_documents/filter", json={}, auth=("harbor", "wrong")).status_code == 401
        env = api_env(base, tmp_path, PREFECT_API_AUTH_STRING=AUTH_STRING)
        assert HTTP.post(f"{base}/api/block_documents/filter", json={}, auth=basic_auth(env)).status_code == 200

        registered = subprocess.run([str(BIN / "prefect"), "block", "register", "-m", "prefect_harbor.blocks"], env=env, capture_output=True, text=True)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        save_backend(env, "deploy-examples", EXAMPLE_TASKS)  # the name serve's and prefect.yaml's runs are given below
        dataset = one_row(tmp_path)

        swept = subprocess.run(
            [str(BIN / "prefect-harbor"), "sweep", "--backend-block", "deploy-examples", "--dataset", dataset,
             "--results", str(tmp_path / "cli"), "--no-prewarm", "--json"],
            env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert swept.returncode == 0, swept.stderr[-3000:]
        assert json.loads(swept.stdout)["success"] == 1

        serve = SharedServe(base, tmp_path, env={"PREFECT_API_AUTH_STRING": AUTH_STRING}, nightly=False)
        try:
            serve.ensure_running()
            run_deployment(serve.env, dataset, tmp_path / "served", tmp_path / "serve.log")
        finally:
            serve.stop()  # the worker's prefect.yaml deployments take over the names it served

        with process_worker(env, tmp_path) as worker_env:
            run_deployment(worker_env, dataset, tmp_path / "by-worker", tmp_path / "worker.log")
