"""Issue 31: one sweep on two hosts, on Prefect's own machinery (``flows/sharding.py``).

A real ``prefect server``, moto's S3 server, and two process workers started as two hosts would
be: each in its own working directory, with its own Prefect home and host name
(``PREFECT_HARBOR_HOST``) and a limit of one shard, on the same podman. The sweep itself runs in
a process of its own, as the CLI's would, with ``shards=2`` (``"auto"``: one per worker online).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import s3fs
from deployment_helpers import BIN, HTTP, REPO, api_env, prefect_server, terminate, wait_until
from tasks_factory import write_task

from prefect_harbor.sandbox.engine import podman_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOSTS = ("host-1", "host-2")
BUCKET = "multihost"


class TwoHosts:
    def __init__(self, base: str, env: dict, scratch: Path, endpoint: str):
        self.base, self.env, self.scratch, self.endpoint = base, env, scratch, endpoint
        self.workers: dict[str, subprocess.Popen] = {}
        self.fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)

    def start_worker(self, host: str) -> None:
        home = self.scratch / host
        (home / "prefect").mkdir(parents=True, exist_ok=True)
        if not (home / "flows").exists():
            (home / "flows").symlink_to(REPO / "flows")  # the project's checkout on that host
        env = {**self.env, "PREFECT_HOME": str(home / "prefect"), "PREFECT_HARBOR_HOST": host, "TMPDIR": str(home)}
        self.workers[host] = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "harbor-process", "--limit", "1", "--name", host],
            env=env, cwd=home, stdout=open(home / "worker.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def sweep(self, dataset: Path, name: str, shards: int | str = 2, resume: str | None = None) -> subprocess.Popen:
        """``evaluation_sweep(shards=…)`` in a process of its own; it prints the summary's JSON."""
        code = (
            "import asyncio\nfrom prefect_harbor.flows import evaluation_sweep\n"
            "async def main():\n"
            f"    state = await evaluation_sweep(dataset={str(dataset)!r}, backend_block='mh-oracle', storage_block='mh-moto',\n"
            f"                                   shards={shards!r}, resume={resume!r}, return_state=True)\n"
            "    print('SUMMARY', (await state.aresult(raise_on_failure=False)).model_dump_json())\n"
            "asyncio.run(main())\n"
        )
        driver = self.scratch / f"driver-{name}"
        driver.mkdir()
        return subprocess.Popen([str(BIN / "python"), "-c", code], env={**self.env, "TMPDIR": str(driver)}, cwd=driver,
                                stdout=open(driver / "sweep.log", "wb"), stderr=subprocess.STDOUT)  # fmt: skip

    def online(self) -> set[str]:
        """The workers the server counts online on the pool (what ``shards="auto"`` counts)."""
        workers = HTTP.post(f"{self.base}/api/work_pools/harbor-process/workers/filter", json={}, timeout=30).json()
        return {worker["name"] for worker in workers if worker["status"] == "ONLINE"}

    def log(self, name: str) -> str:
        driver = self.scratch / f"driver-{name}" / "sweep.log"
        logs = [driver.read_text(errors="replace")[-4000:] if driver.exists() else ""]
        logs += [f"--- {host}\n" + (self.scratch / host / "worker.log").read_text(errors="replace")[-3000:] for host in HOSTS]
        return "\n".join(logs)

    def runs(self) -> list[str]:
        self.fs.invalidate_cache()
        # Run folders are named <date>T<time>Z-<hex>; Prefect's records of failed task runs (UUIDs) sit beside them.
        return sorted(path for path in self.fs.ls(f"{BUCKET}/evals") if RUN_ID.fullmatch(path.rsplit("/", 1)[-1]))

    def results(self, run: str) -> list[dict]:
        import pyarrow.parquet as pq

        with self.fs.open(f"{run}/results.parquet", "rb") as handle:
            return pq.read_table(handle).to_pylist()

    def flow_runs(self, flow: str) -> list[dict]:
        every = HTTP.post(f"{self.base}/api/flow_runs/filter", json={"flows": {"name": {"any_": [flow]}}}, timeout=30).json()
        return sorted(every, key=lambda run: run["created"])


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[TwoHosts]:
    scratch = tmp_path_factory.mktemp("multi-host")
    with prefect_server(scratch / "server") as base:
        env = {**api_env(base, scratch), "PREFECT_WORKER_QUERY_SECONDS": "1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        prefect = str(BIN / "prefect")
        subprocess.run([prefect, "work-pool", "create", "harbor-process", "--type", "process", "--overwrite"], env=env, check=True, capture_output=True)
        deploy = subprocess.run([prefect, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all"], env=env, cwd=REPO, capture_output=True, text=True)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        tasks = scratch / "tasks"
        for name in ("mh-a", "mh-b", "mh-c", "mh-d"):
            write_task(tasks, name, solve='sleep "${MH_SLEEP:-2}"')
        for name in ("mh-long", "mh-long2"):
            write_task(tasks, name, solve="sleep 600")
        write_task(tasks, "mh-mid", solve="sleep 20")
        write_task(tasks, "mh-noreward", test="true")  # its shared verifier writes no reward: an agent failure, counted as 0
        code = (
            "from prefect_harbor.blocks import HarborBackend, ResultsStorage; "
            f"HarborBackend(tasks_dir={str(tasks)!r}, task_mode='dataset', agent='oracle', trials_dir={str(scratch / 'trials')!r}, n_concurrent=2)"
            ".save('mh-oracle', overwrite=True); "
            f"ResultsStorage(url='s3://{BUCKET}/evals', endpoint_url={moto_endpoint!r}, access_key_id='testing', secret_access_key='testing').save('mh-moto', overwrite=True)"
        )
        subprocess.run([str(BIN / "python"), "-c", code], env=env, check=True)
        two = TwoHosts(base, env, scratch, moto_endpoint)
        two.fs.mkdir(BUCKET)
        for host in HOSTS:
            two.start_worker(host)
        wait_until(lambda: two.online() == set(HOSTS), 120, "both workers online", lambda: two.log("none"))
        try:
            yield two
        finally:
            for worker in two.workers.values():
                terminate(worker, timeout=20, group=True)


#: A sweep's run id (``flows/run_folder.py``): its start time and a random suffix.
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")


def dataset(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": row_id, "metadata": {"harbor_task_id": task}}) + "\n" for row_id, task in rows))
    return path


def finished(sweep: subprocess.Popen, hosts: TwoHosts, name: str, timeout: float) -> dict:
    try:
        sweep.wait(timeout)
    except subprocess.TimeoutExpired:
        sweep.kill()
        raise AssertionError(f"the sweep did not finish in {timeout:.0f} s:\n{hosts.log(name)}") from None
    log = (hosts.scratch / f"driver-{name}" / "sweep.log").read_text(errors="replace")
    said = [line for line in log.splitlines() if line.startswith("SUMMARY ")]
    assert said, f"the sweep said no summary (rc {sweep.returncode}):\n{hosts.log(name)}"
    return json.loads(said[-1].removeprefix("SUMMARY "))


def containers_of(prefix: str) -> list[str]:
    return [name for name in podman_sync("ps", "-a", "--format", "{{.Names}}").text.split() if prefix in name]


def test_one_sweep_runs_on_both_hosts_into_one_results_table(hosts, tmp_path):
    rows = [("mh-1", "mh-a"), ("mh-2", "mh-a"), ("mh-3", "mh-b"), ("mh-4", "mh-c"), ("mh-5", "mh-d"), ("mh-6", "mh-d"), ("mh-7", "mh-noreward")]
    summary = finished(hosts.sweep(dataset(tmp_path / "rows.jsonl", rows), "both", shards="auto"), hosts, "both", 300)  # two workers online
    results = {row["row_id"]: row for row in hosts.results(summary["results_uri"].removeprefix("s3://").rsplit("/", 1)[0])}
    assert sorted(results) == [row_id for row_id, _ in rows], hosts.log("both")
    assert {row_id: r["status"] for row_id, r in results.items()} == {**{row_id: "success" for row_id, _ in rows[:-1]}, "mh-7": "failure"}, hosts.log("both")
    assert {r["host"] for r in results.values()} == set(HOSTS), {row_id: r["host"] for row_id, r in results.items()}
    by_task: dict[str, set[str]] = {}
    for row_id, task in rows:
        by_task.setdefault(task, set()).add(results[row_id]["host"])
    assert all(len(seen) == 1 for seen in by_task.values()), by_task  # a task's rows on one host: one image build
    # The scoring contract over the shards' parts: the agent failure counts as 0 in the mean.
    assert (summary["rows"], summary["scored"], summary["agent_failures"], summary["not_scored"]) == (7, 6, 1, {})
    assert summary["mean_reward"] == pytest.approx(6 / 7) and summary["statistics"]["reward"]["mean"] == pytest.approx(6 / 7)
    shards = hosts.flow_runs("sweep-shard")[-2:]
    assert [run["state_type"] for run in shards] == ["COMPLETED", "COMPLETED"]
    parent = hosts.flow_runs("evaluation-sweep")[-1]
    assert all(run["parent_task_run_id"] for run in shards) and parent["state_type"] == "COMPLETED"  # shards are subflows of the sweep
    progress = HTTP.get(f"{hosts.base}/api/artifacts/evaluation-sweep-progress/latest", timeout=30).json()
    assert (progress["flow_run_id"], progress["data"]) == (parent["id"], 100.0)  # the sweep's, for the whole run: shards keep their own keys
    assert not containers_of("mh-"), containers_of("mh-")


def test_cancelling_the_sweep_stops_the_rows_on_every_host_and_resume_runs_only_what_is_missing(hosts, tmp_path):
    # mhc-6 first: its quick task shares shard 0 with mh-long2 and finishes before the cancel.
    rows = [("mhc-6", "mh-a"), ("mhc-1", "mh-long"), ("mhc-2", "mh-long2"), ("mhc-3", "mh-long"), ("mhc-4", "mh-long2"), ("mhc-5", "mh-long")]
    rows_file = dataset(tmp_path / "rows.jsonl", rows)
    sweep = hosts.sweep(rows_file, "cancel")  # a long task to each host, 2 rows at a time: 1 queued
    wait_until(lambda: all(containers_of(row_id) for row_id in ("mhc-1", "mhc-2", "mhc-3", "mhc-4")), 180, "rows running on both hosts")
    run = hosts.runs()[-1]
    wait_until(lambda: {shard_running(hosts, run, row_id) for row_id in ("mhc-1", "mhc-2")} == {"shard-0", "shard-1"}, 180, "both shards' status")
    wait_until(lambda: sweep_status(hosts, run, "mhc-1", "mhc-2") == ["running", "running"], 120, "the sweep's status.json to show both hosts' rows running")
    # A partial cancel, as from any machine: the sweep answers for every host, the host that runs the row stops it.
    partial = subprocess.run(
        [str(BIN / "prefect-harbor"), "cancel", f"s3://{run}", "mhc-1", "mhc-2", "--storage-block", "mh-moto", "--json"],
        env=hosts.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert partial.returncode == 0 and json.loads(partial.stdout) == {"mhc-1": "cancelled_running", "mhc-2": "cancelled_running"}, partial.stdout + partial.stderr
    wait_until(lambda: not containers_of("mhc-1") and not containers_of("mhc-2"), 180, "the two cancelled rows' containers gone")
    assert containers_of("mhc-3") and containers_of("mhc-4"), "the rest still run"
    parent = hosts.flow_runs("evaluation-sweep")[-1]
    asked = time.monotonic()
    HTTP.post(f"{hosts.base}/api/flow_runs/{parent['id']}/set_state", json={"state": {"type": "CANCELLING"}, "force": True}, timeout=30)
    wait_until(lambda: not containers_of("mhc-"), 180, "every row's container gone")
    stopped = time.monotonic() - asked
    summary = finished(sweep, hosts, "cancel", 120)
    results = {row["row_id"]: row for row in hosts.results(summary["results_uri"].removeprefix("s3://").rsplit("/", 1)[0])}
    assert sorted(results) == sorted(row_id for row_id, _ in rows), hosts.log("cancel")
    statuses = {row_id: r["status"] for row_id, r in results.items()}
    assert statuses == {"mhc-6": "success", **{f"mhc-{n}": "cancelled" for n in range(1, 6)}}, [(r["row_id"], r["status"], r["err_message"]) for r in results.values()]
    assert {results[row_id]["host"] for row_id in ("mhc-1", "mhc-2")} == set(HOSTS)  # it stopped rows on both hosts
    assert {results[row_id]["host"] for row_id in ("mhc-3", "mhc-4")} == set(HOSTS)
    print(f"cancel -> every container gone in {stopped:.1f} s")
    assert stopped < 30, stopped
    status = subprocess.run(
        [str(BIN / "prefect-harbor"), "status", f"s3://{run}", "--storage-block", "mh-moto", "--json"], env=hosts.env, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert json.loads(status.stdout)["hosts"] == {row_id: r["host"] for row_id, r in results.items() if r["host"]}, status.stdout + status.stderr

    # --resume on many hosts: the cancelled rows run again (quick now: the oracle's solve.sh is read at trial
    # time), the finished one is kept as it was, and the run folder ends with one complete table.
    for task in ("mh-long", "mh-long2"):
        (hosts.scratch / "tasks" / task / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 1\n")
    resumed = finished(hosts.sweep(rows_file, "resume", resume=f"s3://{run}"), hosts, "resume", 300)
    assert resumed["results_uri"] == summary["results_uri"], (resumed["results_uri"], summary["results_uri"])
    again = {row["row_id"]: row for row in hosts.results(run)}
    assert sorted(again) == sorted(row_id for row_id, _ in rows) and {r["status"] for r in again.values()} == {"success"}, hosts.log("resume")
    assert again["mhc-6"]["trial_name"] == results["mhc-6"]["trial_name"]  # kept, not run again
    assert {r["trial_name"] for n, r in again.items() if n != "mhc-6"}.isdisjoint(r["trial_name"] for r in results.values())
    assert {again[f"mhc-{n}"]["host"] for n in range(1, 6)} == set(HOSTS), hosts.log("resume")  # the re-runs on both hosts again
    assert ": 1 finished attempts kept; run again: mhc-1, mhc-2, mhc-3, mhc-4, mhc-5" in (hosts.scratch / "driver-resume" / "sweep.log").read_text()
    assert not containers_of("mhc-"), containers_of("mhc-")


def test_a_host_killed_mid_row_has_its_rows_run_again_never_twice(hosts, tmp_path):
    rows = [("mhk-1", "mh-mid"), ("mhk-2", "mh-mid"), ("mhk-3", "mh-c"), ("mhk-4", "mh-c")]
    sweep = hosts.sweep(dataset(tmp_path / "rows.jsonl", rows), "kill")
    wait_until(lambda: containers_of("mhk-1") and containers_of("mhk-2"), 180, "the long rows running")
    run = hosts.runs()[-1]
    shard = wait_until(lambda: shard_running(hosts, run, "mhk-1", status=None), 180, f"the status file of the shard that runs mhk-1 in {run}")
    pid = json.loads(hosts.fs.cat(f"{run}/shards/{shard}.heartbeat.json"))["pid"]
    host = next(h for h in HOSTS if pid in {p.pid for p in psutil.Process(hosts.workers[h].pid).children(recursive=True)})
    for process in [psutil.Process(hosts.workers[host].pid), *psutil.Process(hosts.workers[host].pid).children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived child (a podman call) may have ended since it was listed
            process.kill()  # the host dies: its worker, its shard's process and their children
    for name in containers_of("mhk-1") + containers_of("mhk-2"):  # and its containers with it
        podman_sync("rm", "-f", "-t", "0", name)
    hosts.start_worker(host)  # back later: the re-run goes to whichever host takes it
    summary = finished(sweep, hosts, "kill", 300)
    results = hosts.results(summary["results_uri"].removeprefix("s3://").rsplit("/", 1)[0])
    assert sorted(r["row_id"] for r in results) == [row_id for row_id, _ in rows], hosts.log("kill")  # each once
    assert {r["status"] for r in results} == {"success"}, [(r["row_id"], r["status"], r["err_message"]) for r in results]
    assert f"Shard {int(shard[-1]) + 1} (" in hosts.log("kill") and "run again" in hosts.log("kill")
    states = [r["state_type"] for r in hosts.flow_runs("sweep-shard")[-3:]]
    assert sorted(states) == ["COMPLETED", "COMPLETED", "CRASHED"], states  # the dead host's shard says so, not Running


def shard_running(hosts: TwoHosts, run: str, row_id: str, status: str | None = "running") -> str | None:
    """The shard (``shard-0`` or ``shard-1``) whose status file says ``row_id`` is ``status`` (any, with None)."""
    for number in (0, 1):
        try:
            rows = json.loads(hosts.fs.cat(f"{run}/shards/shard-{number}.status.json"))["rows"]
            if row_id in rows and status in (None, rows[row_id]):
                return f"shard-{number}"
        except FileNotFoundError:
            continue
    return None


def sweep_status(hosts: TwoHosts, run: str, *row_ids: str) -> list[str | None]:
    """The rows' status in the sweep's own status.json (merged from every host's)."""
    try:
        rows = json.loads(hosts.fs.cat(f"{run}/status.json"))["rows"]
    except FileNotFoundError:
        return [None for _ in row_ids]
    return [rows.get(row_id) for row_id in row_ids]
