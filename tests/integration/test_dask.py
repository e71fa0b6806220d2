"""Scale-out on an existing engine: the sweep's rows as task runs on a Dask cluster (prefect-dask)."""

from __future__ import annotations

import socket

import pyarrow.parquet as pq
import pytest
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS, EXPECTED_ORACLE_REWARDS

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(300)]


async def test_a_sweep_runs_its_rows_on_a_dask_local_cluster(tmp_path):
    DaskTaskRunner = pytest.importorskip("prefect_dask").DaskTaskRunner
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"))
    runner = DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": 2, "processes": True, "dashboard_address": None})
    on_dask = evaluation_sweep.with_options(task_runner=runner)

    summary = await on_dask(dataset=str(EXAMPLE_DATASET), backend=backend, results=str(tmp_path / "results"), prewarm=False)

    rows = pq.read_table(summary.results_uri).to_pylist()
    assert {r["task"]: r["reward"] for r in rows} == EXPECTED_ORACLE_REWARDS
    assert all(r["artifact_uri"] for r in rows)  # archived by the worker, into the shared results
    assert not any((tmp_path / "trials").rglob("result.json"))  # successful trials cleaned up on the workers
    assert {r["host"] for r in rows} == {socket.gethostname()}  # the machine of the worker that ran each row
