"""Prefect's own cost of spreading one sweep's rows over two hosts, and what cancel and a killed worker do.

    .venv/bin/python benchmarks/multi_host.py              # ~3 minutes
    .venv/bin/python benchmarks/multi_host.py --rows 200 --per-host 8

Starts ``prefect server start`` (own PREFECT_HOME, own port), then two "hosts" the way two
machines would run them: separate working directories and PREFECT_HOMEs, the same server URL,
and a shared folder standing in for the storage every host reaches (a LocalFileSystem block
that task parameters and results go through, since each host's default is its own home).
A row is a task that sleeps ``--seconds`` (no containers: this measures Prefect, not trials).

Mechanisms, each with ``--per-host`` rows at once per host (so ``2 * per-host`` in all):

- ``in-process``: the same rows by ``asyncio.gather`` in this process (no Prefect), the baseline;
- ``in-flow``: the rows as task runs of one flow in this process (today's one-host sweep);
- ``delay``: ``Task.delay`` from a flow to two task workers (``prefect.task_worker.serve``, ``limit``);
- ``deployment``: ``run_deployment`` of one shard flow run per host on a process work pool (two
  ``prefect worker start`` processes), each shard running its rows as task runs.

Then, with long rows: cancel latency (from the parent flow run's cancel to every row stopped),
for ``delay`` (plain, and with the row watching its parent flow run's state) and for
``deployment`` (the server's cleanup service, and the parent setting its shards Cancelling);
and the task-run/flow-run states a SIGKILLed host leaves behind, for both mechanisms.
Every row writes ``started``/``ended`` markers in the shared folder: a row has stopped when its
``ended`` marker exists or its process is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHARED_BLOCK = "mh-shared"
POOL = "mh-pool"
HOSTS = ("host-1", "host-2")


# ---------------------------------------------------------------- the rows (imported on every host)


def _marker(kind: str, mode: str, index: int, **fields: Any) -> None:
    folder = Path(os.environ["MH_SHARED"]) / "rows" / mode
    folder.mkdir(parents=True, exist_ok=True)
    record = {"host": os.environ.get("MH_HOST", "driver"), "pid": os.getpid(), "at": time.time(), **fields}
    (folder / f"{index}.{kind}.json").write_text(json.dumps(record))


async def row_body(mode: str, index: int, seconds: float, watch: bool = False) -> dict:
    """One row: sleep; with ``watch``, stop as soon as the flow run that started it is cancelling."""
    _marker("started", mode, index)
    reason = "done"
    try:
        if watch:
            reason = await _sleep_unless_cancelled(seconds)
        else:
            await asyncio.sleep(seconds)
    except BaseException:
        reason = "interrupted"
        raise
    finally:
        _marker("ended", mode, index, reason=reason)
    return {"index": index, "host": os.environ.get("MH_HOST", "driver"), "reason": reason}


async def _sleep_unless_cancelled(seconds: float) -> str:
    """The worker-side watch: poll the parent flow run's state once a second (one API read per row per second)."""
    from prefect.client.orchestration import get_client
    from prefect.context import TaskRunContext

    flow_run_id = TaskRunContext.get().task_run.flow_run_id
    deadline = time.monotonic() + seconds
    async with get_client() as client:
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(1.0, left))
            if flow_run_id is not None:
                state = (await client.read_flow_run(flow_run_id)).state
                if state is not None and state.type.value in ("CANCELLING", "CANCELLED"):
                    return "cancelled"
    return "done"


def _tasks():
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    @task(name="mh-row", task_run_name="row {index}", cache_policy=NO_CACHE, persist_result=False)
    async def mh_row(mode: str, index: int, seconds: float, watch: bool = False) -> dict:
        return await row_body(mode, index, seconds, watch)

    return mh_row


def _shard_flow():
    from prefect import flow

    row = _tasks()

    @flow(name="mh-shard", persist_result=False)
    async def mh_shard(mode: str, indexes: list[int], seconds: float, concurrency: int) -> int:
        """One host's share of the rows, each its own task run, ``concurrency`` at once."""
        slots = asyncio.Semaphore(concurrency)

        async def one(index: int) -> None:
            async with slots:
                await row(mode, index, seconds, return_state=True)

        await asyncio.gather(*(one(i) for i in indexes))
        return len(indexes)

    return mh_shard


#: The deployment's entrypoint (``multi_host.py:mh_shard``), loaded by the process workers' flow-run processes.
if os.environ.get("MH_SHARED"):
    mh_shard = _shard_flow()


def delay_parent_flow(watch: bool, parent: dict[str, Any]):
    """The sweep's stand-in for ``delay``: every row deferred to the task workers, then awaited."""
    from prefect import flow
    from prefect.runtime import flow_run

    row = _tasks()

    @flow(name="mh-delay-parent", persist_result=False)
    async def mh_delay_parent(mode: str, indexes: list[int], seconds: float) -> list[dict]:
        parent["id"] = flow_run.get_id()
        futures = [row.delay(mode, i, seconds, watch) for i in indexes]
        return await asyncio.gather(*(settled(f) for f in futures))

    return mh_delay_parent


async def settled(future) -> Any:
    """A deferred task run's result. ``wait_async`` raises while the server has not yet recorded the new run's state
    (it is written from events): that is retried."""
    while True:
        try:
            await future.wait_async()
            break
        except RuntimeError as error:
            if "has no state" not in str(error):
                raise
            await asyncio.sleep(0.2)
    return await future.result_async(raise_on_failure=False)


def deployment_parent_flow(deployment: str, per_host: int, parent: dict[str, Any]):
    """The sweep's stand-in for ``deployment``: one shard flow run per host, awaited."""
    from prefect import flow
    from prefect.deployments import run_deployment
    from prefect.runtime import flow_run

    @flow(name="mh-deployment-parent", persist_result=False)
    async def mh_deployment_parent(mode: str, indexes: list[int], seconds: float) -> list[str]:
        parent["id"] = flow_run.get_id()
        shards = [indexes[k :: len(HOSTS)] for k in range(len(HOSTS))]
        parameters = [dict(mode=mode, indexes=shard, seconds=seconds, concurrency=per_host) for shard in shards]
        runs = await asyncio.gather(*(run_deployment(deployment, parameters=p, poll_interval=1) for p in parameters))
        return [run.state.type.value for run in runs]

    return mh_deployment_parent


# ---------------------------------------------------------------- processes: the server and the hosts


def host_env(scratch: Path, host: str, api: str) -> dict[str, str]:
    """What a second machine would have: its own PREFECT_HOME, the server's URL, the shared storage block."""
    home = scratch / host / "prefect-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home), PREFECT_API_URL=api, MH_HOST=host, MH_SHARED=str(scratch / "shared"), PYTHONPATH=str(HERE),
        PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK=f"local-file-system/{SHARED_BLOCK}",
        PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK=f"local-file-system/{SHARED_BLOCK}",
        PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING",
    )  # fmt: skip
    return env


def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def descendants(pid: int) -> list[int]:
    """The process and every process below it (flow-run processes start in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    for each in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, sig)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def session_cpu(session_id: int) -> float:
    """CPU seconds of a session's live processes (the server's); imported late, since the hosts import this module too."""
    from sweep_vs_harbor import session_cpu as cpu_of

    return cpu_of(session_id)


# ---------------------------------------------------------------- the markers


def markers(scratch: Path, mode: str) -> dict[int, dict[str, dict]]:
    rows: dict[int, dict[str, dict]] = {}
    for path in (scratch / "shared" / "rows" / mode).glob("*.json"):
        with contextlib.suppress(ValueError, OSError):
            index, kind, _ = path.name.split(".")
            rows.setdefault(int(index), {})[kind] = json.loads(path.read_text())
    return rows


def stopped(record: dict[str, dict]) -> bool:
    return "ended" in record or ("started" in record and not alive(record["started"]["pid"]))


async def wait_until(predicate, timeout: float, every: float = 0.1) -> float | None:
    """Seconds until ``predicate()`` held, or None at the timeout."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        if predicate():
            return time.perf_counter() - began
        await asyncio.sleep(every)
    return None


# ---------------------------------------------------------------- the driver


class Driver:
    def __init__(self, args: argparse.Namespace, scratch: Path, api: str, server_pid: int):
        self.args, self.scratch, self.api, self.server_pid = args, scratch, api, server_pid
        self.concurrency = 2 * args.per_host
        self.task_workers: dict[str, subprocess.Popen] = {}
        self.process_workers: dict[str, subprocess.Popen] = {}
        self.results: dict[str, dict] = {}
        #: The id of the last parent flow run, set by the parent itself.
        self.parent: dict[str, Any] = {}

    # -- setup

    async def prepare(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate
        from prefect.filesystems import LocalFileSystem
        from prefect.workers.process import ProcessWorker

        await LocalFileSystem(basepath=str(self.scratch / "shared" / "prefect")).save(SHARED_BLOCK, overwrite=True)
        async with get_client() as client:
            template = ProcessWorker.get_default_base_job_template()
            await client.create_work_pool(WorkPoolCreate(name=POOL, type="process", base_job_template=template))
        flow = await _shard_flow().from_source(source=str(HERE), entrypoint="multi_host.py:mh_shard")
        await flow.deploy(name="mh", work_pool_name=POOL, build=False, push=False, print_next_steps=False, ignore_warnings=True)
        self.deployment_name = "mh-shard/mh"

    def start_hosts(self) -> None:
        python = sys.executable
        for host in HOSTS:
            env, cwd = host_env(self.scratch, host, self.api), self.scratch / host
            serve = f"import asyncio, multi_host; from prefect.task_worker import serve; serve(multi_host._tasks(), limit={self.args.per_host})"
            self.task_workers[host] = spawn([python, "-c", serve], env, cwd, cwd / "task-worker.log")
            prefect = str(Path(python).parent / "prefect")
            argv = [prefect, "worker", "start", "--pool", POOL, "--type", "process", "--name", host, "--limit", str(self.args.per_host)]
            self.process_workers[host] = spawn(argv, env, cwd, cwd / "process-worker.log")

    async def wait_for_workers(self) -> float:
        from prefect.client.orchestration import get_client

        began = time.perf_counter()
        async with get_client() as client:
            while time.perf_counter() - began < 120:
                workers = await client.read_workers_for_work_pool(POOL)
                response = await client._client.post("/task_workers/filter", json={})
                if len([w for w in workers if w.status.value == "ONLINE"]) >= 2 and len(response.json()) >= 2:
                    return time.perf_counter() - began
                await asyncio.sleep(0.5)
        raise RuntimeError("workers did not come up: see host-*/ *.log under " + str(self.scratch))

    # -- throughput

    async def throughput(self, name: str, run) -> None:
        rows, seconds = self.args.rows, self.args.seconds
        cpu, began = session_cpu(self.server_pid), time.perf_counter()
        await run(name, list(range(rows)), seconds)
        wall = time.perf_counter() - began
        found = markers(self.scratch, name)
        hosts = Counter(r["started"]["host"] for r in found.values() if "started" in r)
        done = sum(1 for r in found.values() if r.get("ended", {}).get("reason") == "done")
        self.results[name] = dict(wall=wall, server_cpu=session_cpu(self.server_pid) - cpu, done=done, hosts=dict(hosts))
        print(name, self.results[name], flush=True)

    async def in_process(self, mode: str, indexes: list[int], seconds: float) -> None:
        slots = asyncio.Semaphore(self.concurrency)

        async def one(index: int) -> None:
            async with slots:
                await row_body(mode, index, seconds)

        await asyncio.gather(*(one(i) for i in indexes))

    async def in_flow(self, mode: str, indexes: list[int], seconds: float) -> None:
        from prefect import flow

        row = _tasks()

        @flow(name="mh-in-flow", persist_result=False)
        async def in_flow() -> None:
            slots = asyncio.Semaphore(self.concurrency)

            async def one(index: int) -> None:
                async with slots:
                    await row(mode, index, seconds, return_state=True)

            await asyncio.gather(*(one(i) for i in indexes))

        await in_flow()

    def delay_parent(self, watch: bool = False):
        return delay_parent_flow(watch, self.parent)

    def deployment_parent(self):
        return deployment_parent_flow(self.deployment_name, self.args.per_host, self.parent)

    async def delay(self, mode: str, indexes: list[int], seconds: float) -> None:
        await self.delay_parent()(mode, indexes, seconds)

    async def deployment(self, mode: str, indexes: list[int], seconds: float) -> None:
        await self.deployment_parent()(mode, indexes, seconds)

    # -- cancel

    async def cancel_latency(self, name: str, parent, how: str) -> None:
        """Start long rows under ``parent``, cancel it once every row runs, time until every row stopped."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
        from prefect.states import Cancelled, Cancelling

        rows, seconds = self.concurrency, self.args.long_seconds
        self.parent.clear()
        running = asyncio.create_task(parent(name, list(range(rows)), seconds))
        started = await wait_until(lambda: len([r for r in markers(self.scratch, name).values() if "started" in r]) >= rows, 60)
        note = ""
        async with get_client() as client:
            began = time.perf_counter()
            await client.set_flow_run_state(self.parent["id"], Cancelling(), force=True)
            if how == "children":  # the parent itself sets every shard Cancelling, as a sweep's CancelScope would
                children = await client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[self.parent["id"]])))
                for child in children:
                    await client.set_flow_run_state(child.id, Cancelling(), force=True)
                note = f"{len(children)} shard flow runs set Cancelling by the parent"
            running.cancel()  # this in-process parent stops as a cancelled sweep would, then is Cancelled
            with contextlib.suppress(BaseException):
                await running
            await client.set_flow_run_state(self.parent["id"], Cancelled(), force=True)
            waited = time.perf_counter() - began
            took = await wait_until(lambda: all(stopped(r) for r in markers(self.scratch, name).values()), seconds + 10, every=0.2)
            took = None if took is None else took + waited
            found = markers(self.scratch, name)
            reasons = Counter(r.get("ended", {}).get("reason", "process gone") for r in found.values())
            await asyncio.sleep(2)
            states = await self.task_run_states(client)
        self.results[name] = dict(rows=rows, started_in=started, stopped_after=took, natural=seconds, reasons=dict(reasons), task_runs=states, note=note)
        print(name, self.results[name], flush=True)

    async def task_run_states(self, client) -> dict[str, int]:
        """The states of the row task runs under the last parent flow run: its own (delay) and its shards' (deployment)."""
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId, TaskRunFilter, TaskRunFilterFlowRunId

        shards = await client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[self.parent["id"]])))
        flow_runs = [self.parent["id"], *(s.id for s in shards)]
        runs = await client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=flow_runs)), limit=200)
        return dict(Counter(r.state.name for r in runs if r.name.startswith("row ")))

    # -- SIGKILL

    async def sigkill(self, name: str, parent, workers: dict[str, subprocess.Popen]) -> None:
        """Long rows on both hosts; SIGKILL host-2's worker and everything under it mid-row; what stays behind."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        rows, seconds = self.concurrency + 2, self.args.kill_seconds
        self.parent.clear()
        running = asyncio.create_task(parent(name, list(range(rows)), seconds))

        def on_both() -> bool:
            return {r["started"]["host"] for r in markers(self.scratch, name).values() if "started" in r} >= set(HOSTS)

        await wait_until(on_both, 60)
        victim = workers["host-2"]
        killed = [r for r in markers(self.scratch, name).values() if "started" in r and r["started"]["host"] == "host-2"]
        killed_at = time.time()
        kill_tree(victim.pid)
        victim.wait()
        await wait_until(lambda: all(stopped(r) for r in markers(self.scratch, name).values()) and len(markers(self.scratch, name)) >= rows, seconds * 3 + 10)
        await asyncio.sleep(self.args.kill_watch)
        found = markers(self.scratch, name)
        async with get_client() as client:
            shards = await client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[self.parent["id"]])))
            states = await self.task_run_states(client)
            shard_states = {(s.parameters.get("indexes") or [None])[0]: s.state.name for s in shards}
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        rerun = [i for i, r in found.items() if r["started"]["at"] > killed_at]
        self.results[name] = dict(
            rows=rows, killed_mid_row=len(killed), ended=sum(1 for r in found.values() if "ended" in r), restarted_after_kill=len(rerun),
            task_runs=states, shard_flow_runs=shard_states, watched_for=self.args.kill_watch,
        )  # fmt: skip
        print(name, self.results[name], flush=True)

    def stop_hosts(self) -> None:
        for process in [*self.task_workers.values(), *self.process_workers.values()]:
            if process.poll() is None:
                kill_tree(process.pid, signal.SIGTERM)
        for process in [*self.task_workers.values(), *self.process_workers.values()]:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_tree(process.pid)


def report(driver: Driver, args: argparse.Namespace, setup: dict[str, float]) -> None:
    r, c, n = driver.results, driver.concurrency, args.rows
    print(f"setup: server {setup['server']:.1f} s, both hosts' workers online {setup['workers']:.1f} s after start")
    print(f"throughput: {n} rows of {args.seconds} s, {c} at once ({args.per_host} per host x {len(HOSTS)})")
    base = r["in-process"]["wall"]
    for name in ("in-process", "in-flow", "delay", "deployment"):
        x = r.get(name)
        if x is None:
            continue
        overhead = (x["wall"] - base) * c / n
        print(
            f"  {name:<11} wall {x['wall']:6.2f} s  ratio {x['wall'] / base:5.2f}  overhead {overhead * 1000:7.0f} ms per row (slot time)"
            f"  server CPU {x['server_cpu'] / n * 1000:5.0f} ms/row  done {x['done']}/{n}  hosts {x['hosts']}"
        )
    print(f"cancel: {c} rows of {args.long_seconds} s, parent flow run set Cancelling once all had started, then Cancelled")
    for name in ("cancel-delay", "cancel-delay-watch", "cancel-deployment-server", "cancel-deployment-parent"):
        x = r.get(name)
        if x is None:
            continue
        after = "never (timeout)" if x["stopped_after"] is None else f"{x['stopped_after']:.1f} s"
        print(f"  {name:<25} every row stopped after {after} (rows last {x['natural']} s)  ends {x['reasons']}  task runs {x['task_runs']} {x['note']}")
    print(f"sigkill: host-2's worker and its children SIGKILLed mid-row; states read {args.kill_watch} s after the other rows ended")
    for name in ("sigkill-delay", "sigkill-deployment"):
        x = r.get(name)
        if x is None:
            continue
        print(
            f"  {name:<19} rows {x['rows']}, killed mid-row {x['killed_mid_row']}, ended {x['ended']}, started after the kill {x['restarted_after_kill']}"
            f"  task runs {x['task_runs']}  shard flow runs {x['shard_flow_runs']}"
        )
    print(json.dumps({"setup": setup, **r}, default=str))


async def drive(args: argparse.Namespace, scratch: Path) -> None:
    from sweep_vs_harbor import prefect_server  # late, as session_cpu: the hosts import this module too

    began = time.perf_counter()
    with prefect_server(scratch / "server-home", scratch / "server.log") as (api, server_pid):
        setup = {"server": time.perf_counter() - began}
        await drive_hosts(args, scratch, api, server_pid, setup)


async def drive_hosts(args: argparse.Namespace, scratch: Path, api: str, server_pid: int, setup: dict[str, float]) -> None:
    driver_env = host_env(scratch, "driver", api)
    os.environ.update(driver_env)
    for key in [k for k in os.environ if k.startswith("PREFECT_") and k not in driver_env]:
        del os.environ[key]
    driver = Driver(args, scratch, api, server_pid)
    try:
        await driver.prepare()
        driver.start_hosts()
        setup["workers"] = await driver.wait_for_workers()
        await driver.throughput("in-process", driver.in_process)
        await driver.throughput("in-flow", driver.in_flow)
        await driver.throughput("delay", driver.delay)
        await driver.throughput("deployment", driver.deployment)
        if not args.skip_cancel:
            await driver.cancel_latency("cancel-delay", driver.delay_parent(), "parent")
            await driver.cancel_latency("cancel-delay-watch", driver.delay_parent(watch=True), "parent")
            await driver.cancel_latency("cancel-deployment-server", driver.deployment_parent(), "parent")
            await driver.cancel_latency("cancel-deployment-parent", driver.deployment_parent(), "children")
        if not args.skip_kill:
            await driver.sigkill("sigkill-delay", driver.delay_parent(), driver.task_workers)
            await driver.sigkill("sigkill-deployment", driver.deployment_parent(), driver.process_workers)
        report(driver, args, setup)
    finally:
        driver.stop_hosts()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=24, help="rows in the throughput runs")
    parser.add_argument("--seconds", type=float, default=0.5, help="how long a row sleeps")
    parser.add_argument("--per-host", type=int, default=4, help="rows at once per host (task worker limit, process worker limit, shard concurrency)")
    parser.add_argument("--long-seconds", type=float, default=12.0, help="how long a row sleeps in the cancel runs")
    parser.add_argument("--kill-seconds", type=float, default=6.0, help="how long a row sleeps in the SIGKILL runs")
    parser.add_argument("--kill-watch", type=float, default=5.0, help="seconds to wait after the surviving rows ended before reading states")
    parser.add_argument("--skip-cancel", action="store_true")
    parser.add_argument("--skip-kill", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs of the server and both hosts)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="multi-host-"))
    print(f"scratch: {scratch}", flush=True)
    try:
        asyncio.run(drive(args, scratch))
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import multi_host  # the same module the hosts import, so task keys match

    multi_host.main()
