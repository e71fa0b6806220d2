"""Run-level cancellation: from the Prefect API and from signals, nothing left running."""

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.events.clients import PrefectEventSubscriber
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.states import Cancelling, Running
from prefect_reads import artifacts_of, task_runs_of
from tasks_factory import BASE_IMAGE, slow_and_queued, write_task

from prefect_harbor.blocks import HarborBackend, ResultsStorage
from prefect_harbor.flows import cancellation, evaluation_sweep
from prefect_harbor.flows.cancellation import CancelScope
from prefect_harbor.host import host_name
from prefect_harbor.sandbox.engine import LABEL_OWNER, podman_sync
from prefect_harbor.sandbox.janitor import reap_orphans
from prefect_harbor.sandbox.owners import owner_token

pytestmark = pytest.mark.integration


def marked_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


async def running_sweep_of(dataset: Path):
    """The running flow run sweeping ``dataset``."""
    async with get_client() as client:
        running = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])))
        )
    (run,) = [r for r in running if r.parameters.get("dataset") == str(dataset)]
    return run


async def running_sweep_of_id(client, dataset: Path):
    """The id of the (finished or running) flow run that swept ``dataset``."""
    (run,) = [r.id for r in await client.read_flow_runs() if r.parameters.get("dataset") == str(dataset)]
    return run


async def wait_for(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def start_slow_sweep(tmp_path: Path, marker: str, rows_per_task_run: int | None = None) -> tuple[Path, asyncio.Task]:
    """The slow-and-queued sweep, started in this process; returns once both slow trials run."""
    dataset = slow_and_queued(tmp_path, marker)
    backend = HarborBackend(tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=2)
    sweep = asyncio.create_task(
        evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"), rows_per_task_run=rows_per_task_run, return_state=True)
    )
    await wait_for(lambda: len(marked_processes(marker)) == 2, what="both slow trials to be running")
    return dataset, sweep


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("rows_per_task_run", [1, 5], ids=["row-per-task-run", "batched"])
async def test_cancelling_the_flow_run_stops_every_trial_and_keeps_the_record(tmp_path, rows_per_task_run):
    marker = f"cancel-api-{os.getpid()}-{rows_per_task_run}"
    dataset, sweep = await start_slow_sweep(tmp_path, marker, rows_per_task_run)

    run = await running_sweep_of(dataset)
    requested = time.monotonic()
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelling(), force=True)
    await wait_for(lambda: not marked_processes(marker), timeout=120, what="the sandboxes to be gone")
    gone_after = time.monotonic() - requested
    state = await sweep
    print(f"cancel request -> last sandbox gone: {gone_after:.2f} s; -> flow Cancelled: {time.monotonic() - requested:.2f} s")

    assert state.is_cancelled()
    assert gone_after < 15
    async with get_client() as client:
        assert (await client.read_flow_run(run.id)).state.is_cancelled()
    (results,) = (tmp_path / "results").glob("*/results.parquet")
    rows = {r["row_id"]: r for r in pq.read_table(results).to_pylist()}
    assert {r["status"] for r in rows.values()} == {"cancelled"}
    assert rows["s1"]["err_message"] == "cancelled while running" and Path(rows["s1"]["trial_dir"], "result.json").is_file()
    assert rows["q0"]["err_message"] == "cancelled before it started" and rows["q0"]["trial_dir"] is None
    assert not any((tmp_path / "trials").glob("*/q0__*")), "a queued row reached a sandbox"
    assert json.loads(next((tmp_path / "results").glob("*/manifest.json")).read_text())["state"] == "Cancelled"


@pytest.mark.parametrize(
    ("signum", "on_its_own_server"),
    # Ctrl-C as by hand, on the CLI's own temporary Prefect server (its start and its shutdown after
    # the signal included); SIGTERM as from a supervisor, against a running server (PREFECT_API_URL),
    # which spares a second ~20 s temporary-server start.
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["Ctrl-C-to-the-process-group", "SIGTERM"],
)
def test_the_cli_cancels_on_a_signal(tmp_path, signum, on_its_own_server, request):
    """Ctrl-C in a terminal signals the whole foreground process group: the CLI runs in a group of
    its own here (as a terminal's foreground job) and SIGINT goes to that group, as a terminal sends it."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    if not on_its_own_server:
        from prefect.settings import get_current_settings

        request.getfixturevalue("prefect_server")
        env["PREFECT_API_URL"] = str(get_current_settings().api.url)
    marker = f"cancel-{signum.name}-{os.getpid()}"
    dataset = slow_and_queued(tmp_path, marker)
    cli = str(Path(sys.executable).parent / "prefect-harbor")
    process = subprocess.Popen(
        [cli, "sweep", "--tasks-dir", str(tmp_path / "tasks"), "--dataset", str(dataset), "--results", str(tmp_path / "results"), "--concurrency", "2"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "cli.log", "wb"), env=env, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while len(marked_processes(marker)) < 2:
        assert process.poll() is None, (tmp_path / "cli.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    stdout, _ = process.communicate(timeout=15)
    assert process.returncode == 130, (tmp_path / "cli.log").read_text()[-3000:]
    if on_its_own_server:  # the temporary server, in a session of its own, must not outlive the CLI
        port = int(re.search(r"Starting temporary server on http://127.0.0.1:(\d+)", (tmp_path / "cli.log").read_text())[1])
        deadline = time.monotonic() + 10
        while listening(port):
            assert time.monotonic() < deadline, "the CLI's temporary Prefect server outlived it"
            time.sleep(0.2)
    assert "5 rows: 0 success, 0 failure, 5 cancelled" in stdout
    assert marked_processes(marker) == []
    (results,) = (tmp_path / "results").glob("*/results.parquet")
    assert pq.read_table(results).column("status").to_pylist() == ["cancelled"] * 5


def test_the_janitor_removes_containers_whose_owner_died_and_keeps_the_rest():
    # The orphan's owner is alive while its container starts (a sweep running beside this
    # test, under pytest-xdist, reaps dead owners' containers too), then it dies.
    owner = subprocess.Popen(["sleep", "600"])
    labels = {"orphan": owner_token(owner.pid), "kept": owner_token()}
    names = {}
    for role, token in labels.items():
        names[role] = f"ph-janitor-{role}-{os.getpid()}"
        podman_sync("run", "-d", "--name", names[role], "--label", f"{LABEL_OWNER}={token}", BASE_IMAGE, "sleep", "600").check("run")
    owner.kill()
    owner.wait()
    try:
        reap_orphans()  # this call, or a concurrent sweep's: the janitor's either way
        assert podman_sync("container", "exists", names["orphan"]).returncode == 1
        assert podman_sync("container", "exists", names["kept"]).returncode == 0
    finally:
        podman_sync("rm", "--ignore", "-f", "-t", "0", *names.values())


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "prefect-harbor"), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("rows_per_task_run", [1, 5], ids=["row-per-task-run", "batched"])
async def test_rows_are_cancelled_by_id_and_prefix_with_osmosis_dispositions(tmp_path, rows_per_task_run):
    """Batched, a cancelled row ends alone: the rest of its task run goes on (and records the cancelled queued rows)."""
    marker = f"cancel-partial-{os.getpid()}-{rows_per_task_run}"
    dataset, sweep = await start_slow_sweep(tmp_path, marker, rows_per_task_run)
    (run,) = (tmp_path / "results").glob("*/manifest.json")
    run = str(run.parent)
    await wait_for(lambda: (Path(run) / "status.json").is_file() and '"s1": "running"' in (Path(run) / "status.json").read_text(), what="status")

    status = json.loads((await asyncio.to_thread(cli, "status", run, "s1", "q0", "nope", "--json")).stdout)
    assert status["rows"] == {"s1": "running", "q0": "queued", "nope": "unknown"} and status["state"] == "Running"
    assert status["hosts"] == {"s1": host_name()}  # the rows that started, with the host that runs them

    answer = await asyncio.to_thread(cli, "cancel", run, "s1", "nope", "--prefix", "q", "--json")
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout) == {
        "s1": "cancelled_running", "nope": "not_found", "q0": "cancelled_queued", "q1": "cancelled_queued", "q2": "cancelled_queued",
    }  # fmt: skip
    await wait_for(lambda: len(marked_processes(marker)) == 1, timeout=120, what="s1's sandbox to go")
    # Its processes die first; the row ends once its container is removed and its record written.
    await wait_for(lambda: '"s1": "cancelled"' in (Path(run) / "status.json").read_text(), timeout=120, what="s1 to be recorded")
    again = json.loads((await asyncio.to_thread(cli, "cancel", run, "s1", "s2", "--json")).stdout)
    assert again == {"s1": "not_found", "s2": "cancelled_running"}, "cancelling is idempotent"
    state = await sweep
    assert state.is_completed(), "cancelling rows is not cancelling the run"
    rows = {r["row_id"]: r for r in pq.read_table(Path(run) / "results.parquet").to_pylist()}
    assert {k: (r["status"], r["err_message"]) for k, r in rows.items()} == {
        "s1": ("cancelled", "cancelled while running"), "s2": ("cancelled", "cancelled while running"),
        "q0": ("cancelled", "cancelled before it started"), "q1": ("cancelled", "cancelled before it started"),
        "q2": ("cancelled", "cancelled before it started"),
    }  # fmt: skip
    assert not any((tmp_path / "trials").glob("*/q0__*")), "a cancelled queued row reached a sandbox"
    final = json.loads((await asyncio.to_thread(cli, "status", run, "--json")).stdout)
    assert final["state"] == "Completed" and final["counts"] == {"cancelled": 5}
    async with get_client() as client:
        flow_run = await running_sweep_of_id(client, dataset)
        task_runs = [r for r in await task_runs_of(client, flow_run) if r.name.startswith("row")]
    assert task_runs and {r.state.type.value for r in task_runs} == {"CANCELLED"}, [(r.name, r.state) for r in task_runs]
    assert marked_processes(marker) == []


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("saved_storage", [False, True], ids=["results-path", "storage-block"])
async def test_a_cancelled_run_resumes_without_redoing_finished_rows(tmp_path, saved_storage):
    """With a saved Results Storage block, Prefect's own task results persist there too, under keys
    the resumed run's rows share: the cancelled row must run again, not come back Cached."""
    marker = f"resume-{os.getpid()}-{saved_storage}"
    tasks = tmp_path / "tasks"
    write_task(tasks, "quick")
    write_task(tasks, "slow", solve=f"bash -c 'sleep 6 & wait' {marker}")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "metadata": {"harbor_task_id": t}}) + "\n" for i, t in [("a", "quick"), ("b", "slow"), ("c", "quick")]))
    backend = HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=1, cleanup_successful_trials=False)
    where = {"results": str(tmp_path / "results")}
    if saved_storage:
        await ResultsStorage(url=str(tmp_path / "results")).save(f"resume-{os.getpid()}", overwrite=True)
        where = {"storage_block": f"resume-{os.getpid()}"}
    first = asyncio.create_task(evaluation_sweep(dataset=str(dataset), backend=backend, **where, return_state=True))
    await wait_for(lambda: marked_processes(marker), what="the slow row to run")
    run = await running_sweep_of(dataset)
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelling(), force=True)
    assert (await first).is_cancelled()
    (folder,) = (tmp_path / "results").glob("*/manifest.json")
    folder = str(folder.parent)
    first_a = next(r for r in pq.read_table(Path(folder) / "results.parquet").to_pylist() if r["row_id"] == "a")
    assert first_a["status"] == "success"

    changed = tmp_path / "changed.jsonl"
    changed.write_text(dataset.read_text().replace('"c"', '"c2"'))
    refused = await evaluation_sweep(dataset=str(changed), backend=backend, resume=folder, **where, return_state=True)
    assert refused.is_failed() and "the dataset changed" in refused.message

    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, resume=folder, **where)
    rows = {r["row_id"]: r for r in pq.read_table(summary.results_uri).to_pylist()}
    assert {k: r["status"] for k, r in rows.items()} == {"a": "success", "b": "success", "c": "success"}
    assert rows["a"]["trial_name"] == first_a["trial_name"], "a finished row was run again"
    assert len(list((tmp_path / "trials").glob("*/a__*"))) == 1
    manifest = json.loads((Path(folder) / "manifest.json").read_text())
    assert (manifest["state"], manifest["resumed"]) == ("Completed", 1)


@pytest.mark.usefixtures("prefect_server")
async def test_a_retry_of_a_cancelled_flow_run_resumes_its_own_run_folder(tmp_path, monkeypatch):
    """Prefect's Retry (the UI's button: AwaitingRetry, then the same flow run again) continues
    that run's folder, keeping its finished rows, instead of starting a second one; it keeps the
    run's name, and its report says which rows ran again (their first task runs are superseded)."""
    from datetime import datetime, timedelta

    from prefect.flow_engine import run_flow_async
    from prefect.states import AwaitingRetry

    from prefect_harbor.flows import reporting

    marker = f"retry-{os.getpid()}"
    tasks = tmp_path / "tasks"
    write_task(tasks, "quick")
    write_task(tasks, "slow", solve=f"bash -c 'sleep 6 & wait' {marker}")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "metadata": {"harbor_task_id": t}}) + "\n" for i, t in [("a", "quick"), ("b", "slow")]))
    backend = HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=1, cleanup_successful_trials=False)
    parameters = {"dataset": str(dataset), "backend": backend, "results": str(tmp_path / "results")}
    first = asyncio.create_task(evaluation_sweep(**parameters, return_state=True))
    await wait_for(lambda: marked_processes(marker), what="the slow row to run")
    run = await running_sweep_of(dataset)
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelling(), force=True)
    assert (await first).is_cancelled()
    (folder,) = [m.parent for m in (tmp_path / "results").glob("*/manifest.json")]

    async with get_client() as client:
        await client.set_flow_run_state(run.id, AwaitingRetry(), force=True)
        again = await client.read_flow_run(run.id)

    class HoursLater(datetime):  # the Retry comes later: a name made afresh would differ
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(hours=3)

    monkeypatch.setattr(reporting, "datetime", HoursLater)
    first_name = again.name  # a str: the engine renames the object it is given
    state = await run_flow_async(evaluation_sweep, flow_run=again, parameters=parameters, return_type="state")
    assert state.is_completed(), state
    async with get_client() as client:
        assert (await client.read_flow_run(run.id)).name == first_name, "the retry renamed the run"
        reports = await artifacts_of(client, run.id, reporting.REPORT_KEY)
    report = max(reports, key=lambda a: a.created).data
    assert "## Rows run again" in report and "ran again: their earlier task runs (Cancelled) are superseded" in report and report.count(": b.") == 1, report
    assert [m.parent for m in (tmp_path / "results").glob("*/manifest.json")] == [folder], "the retry started a second run folder"
    rows = {r["row_id"]: r for r in pq.read_table(folder / "results.parquet").to_pylist()}
    assert {k: r["status"] for k, r in rows.items()} == {"a": "success", "b": "success"}
    assert len(list((tmp_path / "trials").glob("*/a__*"))) == 1, "a finished row was run again"
    assert json.loads((folder / "manifest.json").read_text())["resumed"] == 1


@pytest.mark.usefixtures("prefect_server")
async def test_status_says_stale_after_kill_9_and_the_next_sweep_marks_it_crashed(tmp_path):
    from prefect.settings import get_current_settings

    marker = f"kill9-{os.getpid()}"
    dataset = slow_and_queued(tmp_path, marker)
    results = tmp_path / "results"
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefect-harbor"), "sweep", "--tasks-dir", str(tmp_path / "tasks"), "--dataset", str(dataset),
         "--results", str(results), "--concurrency", "2"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "cli.log", "wb"),
        env={**os.environ, "TMPDIR": str(tmp_path), "PREFECT_API_URL": str(get_current_settings().api.url)},
    )  # fmt: skip
    await wait_for(lambda: len(marked_processes(marker)) == 2 or process.poll() is not None, timeout=180, what="both slow trials")
    assert process.poll() is None, (tmp_path / "cli.log").read_text()[-3000:]
    (run,) = [str(p.parent) for p in results.glob("*/manifest.json")]
    await wait_for(lambda: '"running": 2' in (Path(run) / "status.json").read_text(), what="the status file")
    process.kill()
    process.wait()

    status = await asyncio.to_thread(cli, "status", run)
    assert status.returncode == 0, status.stderr
    assert "Running; 3 queued, 2 running" in status.stdout
    assert "stale: no heartbeat since" in status.stdout and f"its process {process.pid}" in status.stdout and "is gone" in status.stdout
    assert f"--resume {run}" in status.stdout
    asked = time.monotonic()
    answer = await asyncio.to_thread(cli, "cancel", run, "--all")
    assert time.monotonic() - asked < 10, "a stale run is answered at once, not after the 30 s wait"
    assert answer.returncode == 2 and "is stale" in answer.stderr and f"--resume {run}" in answer.stderr

    flow_run_id = json.loads((Path(run) / "manifest.json").read_text())["flow_run_id"]
    async with get_client() as client:
        assert (await client.read_flow_run(flow_run_id)).state.is_running(), "Prefect cannot know by itself"
    write_task(tmp_path / "tasks", "next")
    (tmp_path / "next.jsonl").write_text(json.dumps({"id": "n", "metadata": {"harbor_task_id": "next"}}) + "\n")
    backend = HarborBackend(tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"))
    await evaluation_sweep(dataset=str(tmp_path / "next.jsonl"), backend=backend, results=str(results))
    async with get_client() as client:
        assert (await client.read_flow_run(flow_run_id)).state.is_crashed()
    assert json.loads((Path(run) / "manifest.json").read_text())["state"] == "Crashed"
    await wait_for(lambda: not marked_processes(marker), timeout=120, what="the killed run's containers to go")


@pytest.mark.usefixtures("prefect_server")
async def test_cleanup_marks_only_dead_runs_crashed(tmp_path):
    from datetime import UTC, datetime, timedelta

    from prefect import flow
    from prefect.settings import get_current_settings
    from prefect.states import Completed, Running

    from prefect_harbor.storage.control import HEARTBEAT_FILE, STALE_AFTER_SECONDS, Heartbeat
    from prefect_harbor.storage.run_store import RunManifest, RunStore

    @flow
    def evaluation_sweep_stand_in() -> None: ...

    results = tmp_path / "results"
    flow_runs = {}
    async with get_client() as client:
        for name, state, beat_age, host in [
            ("dead", Running(), STALE_AFTER_SECONDS + 30, "another-machine"),  # a lost machine: only the age tells
            ("dead-but-finished-in-prefect", Completed(), STALE_AFTER_SECONDS + 30, "another-machine"),
            ("alive", Running(), 0, None),  # this process, beating
        ]:
            flow_runs[name] = await client.create_flow_run(evaluation_sweep_stand_in, state=state)
            store = RunStore(str(results), name, fallback_dir=tmp_path / "fb")
            beat = Heartbeat.now(str(flow_runs[name].id))
            beat = beat.model_copy(update={"at": beat.at - timedelta(seconds=beat_age), "host": host or beat.host})
            store.write_now(HEARTBEAT_FILE, beat.model_dump_json().encode())
            store.write_manifest(
                RunManifest(run_id=name, flow_run_id=str(flow_runs[name].id), state="Running", started_at=datetime.now(UTC), dataset={}, configuration={}, versions={})
            )
    env = {**os.environ, "PREFECT_API_URL": str(get_current_settings().api.url)}
    done = await asyncio.to_thread(
        subprocess.run, [str(Path(sys.executable).parent / "prefect-harbor"), "cleanup", "--results", str(results)], capture_output=True, text=True, env=env, timeout=120
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 run(s) under" in done.stdout and "marked Crashed" in done.stdout
    assert f"flow run {flow_runs['dead'].name}" in done.stderr, done.stderr
    async with get_client() as client:
        states = {name: (await client.read_flow_run(run.id)).state.type for name, run in flow_runs.items()}
    assert states == {"dead": StateType.CRASHED, "dead-but-finished-in-prefect": StateType.COMPLETED, "alive": StateType.RUNNING}
    manifests = {name: json.loads((results / name / "manifest.json").read_text())["state"] for name in flow_runs}
    assert manifests == {"dead": "Crashed", "dead-but-finished-in-prefect": "Crashed", "alive": "Running"}


async def scope_on_a_running_flow_run(what: str):
    """A flow run marked Running (no process behind it) and a CancelScope entered on it."""

    from prefect import flow

    @flow
    def stand_in_for_a_sweep() -> None: ...

    async with get_client() as client:
        run = await client.create_flow_run(stand_in_for_a_sweep, state=Running(), name=what)
    return run, CancelScope(run.id, logging.getLogger(f"test.{what}"))


@pytest.mark.usefixtures("prefect_server")
async def test_a_cancel_reaches_the_sweep_on_the_event_stream_without_reading_the_state(monkeypatch):
    monkeypatch.setattr(cancellation, "POLL_BEHIND_EVENTS_SECONDS", 3600.0)  # while events flow, no read would see it
    run, scope = await scope_on_a_running_flow_run("cancel-by-event")
    async with scope:
        await wait_for(lambda: scope.following_events, timeout=120, what="the event stream")
        requested = time.monotonic()
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Cancelling(), force=True)
        await asyncio.wait_for(scope.requested.wait(), timeout=15)
        print(f"cancel request -> seen on the event stream: {time.monotonic() - requested:.2f} s")
    assert scope.reason == "the flow run was cancelled"


async def wait_for_event(client, resource_id: str, name: str, timeout: float = 30) -> None:
    """Until the server has stored the event (it stores events a moment after they happen)."""
    stored = EventFilter(resource=EventResourceFilter(id=[resource_id]), event=EventNameFilter(name=[name]))
    deadline = time.monotonic() + timeout
    while not (await client.read_events(filter=stored, limit=1)).events:  # the default, 100, is over the server's 50
        assert time.monotonic() < deadline, f"the server did not store {name}"
        await asyncio.sleep(0.2)


@pytest.mark.usefixtures("prefect_server")
async def test_a_cancel_from_before_a_retry_replayed_by_the_event_stream_does_not_stop_the_retry():
    """The stream replays the last minute's events on subscribing; a retried run's own earlier cancel is one."""
    run, scope = await scope_on_a_running_flow_run("retried-after-a-cancel")
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelling(), force=True)
        await client.set_flow_run_state(run.id, Running(), force=True)  # the retry runs it again
        await wait_for_event(client, f"prefect.flow-run.{run.id}", "prefect.flow-run.Cancelling")  # stored, so it is replayed
    async with scope:
        await wait_for(lambda: scope.following_events or scope.requested.is_set(), timeout=120, what="the event stream")
        await asyncio.sleep(3)
        assert not scope.requested.is_set(), scope.reason


class StreamDown(PrefectEventSubscriber):
    async def __aenter__(self):
        raise ConnectionRefusedError("no event stream here")


@pytest.mark.usefixtures("prefect_server")
async def test_without_the_event_stream_a_cancel_is_read_from_the_state_every_second(monkeypatch):
    monkeypatch.setattr(cancellation, "get_events_subscriber", StreamDown)
    run, scope = await scope_on_a_running_flow_run("cancel-by-poll")
    async with scope:
        await asyncio.sleep(2 * cancellation.POLL_SECONDS)
        assert not scope.following_events
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Cancelling(), force=True)
        await asyncio.wait_for(scope.requested.wait(), timeout=5 * cancellation.POLL_SECONDS)
    assert scope.reason == "the flow run was cancelled"
