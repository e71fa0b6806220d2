"""What each kind of request a sweep sends costs the Prefect server, in CPU per request.

    .venv/bin/python benchmarks/server_costs.py --count 300

Starts a Prefect server on a fresh SQLite database (start-up not counted) and, from one flow
run in this process, sends ``--count`` of each request a sweep sends while it runs, one
kind at a time: a read of its own flow run (the cancellation poll), a progress-artifact
update, a log record in a batch of its own, log records in batches of 50, a task run of an
empty task (its create, state events and result), a custom event. Before, between and
after them the server sits idle for ``--idle`` seconds, to measure what its own services
cost per second; each kind's figure is its CPU from the first request until the server is back near its idle
rate (it works through events after answering them), less the idle rate, divided by the count. The server's CPU is its process group's (``/proc/<pid>/stat``), so the
database, which SQLite runs inside the server, is included.

This process's CPU per request (the client's side: httpx, pydantic, the events worker) is
printed beside the server's. The last line is ``ratio=<task run / progress update, server +
client CPU> overhead_ms=<a progress update and 1.8 s of 1 s polls: a quick row's share at C = 8>
peak_rss_mb=<this process> loop_p99_ms=nan``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_vs_harbor import prefect_server, proc_status_mb, session_cpu  # noqa: E402


async def measure(server_pid: int, count: int, idle: float) -> dict[str, float]:
    from prefect import flow, task
    from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import LogCreate
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker
    from prefect.runtime import flow_run

    @task(persist_result=False)
    async def empty() -> None:
        return None

    idle_rates: list[float] = []

    async def idle_rate() -> None:
        before, began = session_cpu(server_pid), time.perf_counter()
        await asyncio.sleep(idle)
        idle_rates.append((session_cpu(server_pid) - before) / (time.perf_counter() - began))

    async def timed(send) -> tuple[float, float, float]:
        """(server CPU, wall, this process's CPU) of ``send()`` and of the server settling afterwards (events drain)."""
        before, began, client = session_cpu(server_pid), time.perf_counter(), time.process_time()
        await send()
        await asyncio.to_thread(EventsWorker.drain_all, 60)
        client = time.process_time() - client
        await settled()  # the server works through events after it has answered them
        return session_cpu(server_pid) - before, time.perf_counter() - began, client

    async def settled(most: float = 120.0) -> None:
        """Wait until a second of the server's CPU is back near its idle rate."""
        deadline = time.perf_counter() + most
        while time.perf_counter() < deadline:
            before = session_cpu(server_pid)
            await asyncio.sleep(1.0)
            if session_cpu(server_pid) - before <= 2 * min(idle_rates) + 0.01:
                return

    @flow(name="server-costs", persist_result=False)
    async def costs() -> dict[str, tuple[float, float, float]]:
        run_id = flow_run.get_id()
        raw: dict[str, tuple[float, float, float]] = {}
        async with get_client() as client:
            await idle_rate()

            async def polls() -> None:
                for _ in range(count):
                    await client.read_flow_run(run_id)

            async def progress() -> None:
                artifact = await acreate_progress_artifact(0.0, key="server-costs-progress")
                for n in range(count):
                    await aupdate_progress_artifact(artifact, 100 * (n + 1) / count)

            def records(n: int) -> list[dict]:
                return [LogCreate(name="bench", level=20, message=f"row {i} done", timestamp=time.time(), flow_run_id=run_id).model_dump(mode="json") for i in range(n)]

            async def single_logs() -> None:
                for _ in range(count):
                    await client.create_logs(records(1))

            async def batched_logs() -> None:
                for _ in range(count // 50):
                    await client.create_logs(records(50))

            async def task_runs() -> None:
                for _ in range(count):
                    await empty()

            async def events() -> None:
                for n in range(count):
                    emit_event(event="bench.row.finished", resource={"prefect.resource.id": f"bench.row.{n}"})

            for name, send in [("flow-run read (cancellation poll)", polls), ("progress-artifact update", progress),
                               ("log record, one per request", single_logs), ("log record, 50 per request", batched_logs),
                               ("task run of an empty task", task_runs), ("custom event", events)]:  # fmt: skip
                raw[name] = await timed(send)
                await idle_rate()
        return raw

    raw = await costs()
    rate = sorted(idle_rates)[len(idle_rates) // 2]  # the median: the first idle spell can hold the server's start-up tail
    per_kind = {}
    for name, (cpu, wall, client) in raw.items():
        sent = count if "50 per" not in name else (count // 50) * 50
        per_kind[name] = (1000 * (cpu - rate * wall) / sent, 1000 * client / sent)
    per_kind["idle, per second"] = (1000 * rate, math.nan)
    print("idle server CPU ms/s, each spell: " + ", ".join(f"{1000 * r:.1f}" for r in idle_rates))
    return per_kind


def main(arguments: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="server-costs-") as scratch:
        home = Path(scratch)
        with prefect_server(home / "prefect-home", home / "server.log") as (api, server_pid):
            os.environ["PREFECT_API_URL"] = api
            began = time.perf_counter()
            per_kind = asyncio.run(measure(server_pid, arguments.count, arguments.idle))
            print(f"{arguments.count} of each, in {time.perf_counter() - began:.0f} s; load {os.getloadavg()[0]:.1f}")
    print(f"{'request':40} {'server CPU ms':>14} {'client CPU ms':>14}")
    for name, (server, client) in per_kind.items():
        print(f"{name:40} {server:14.2f} {client:14.2f}")
    # A quick row finishes every ~1.8 s at C = 8 here: the poll runs ~1.8 times per row, the progress update once.
    cost = {name: server + (0 if math.isnan(client) else client) for name, (server, client) in per_kind.items()}
    per_row = cost["progress-artifact update"] + 1.8 * cost["flow-run read (cancellation poll)"]
    ratio = cost["task run of an empty task"] / cost["progress-artifact update"]
    print(f"ratio={ratio:.3f} overhead_ms={per_row:.1f} peak_rss_mb={proc_status_mb('VmHWM'):.0f} loop_p99_ms={math.nan}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--count", type=int, default=300, help="requests of each kind")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds of idle server between kinds")
    main(parser.parse_args())
