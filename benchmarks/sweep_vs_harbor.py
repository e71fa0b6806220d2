"""The evaluation sweep against Harbor's own job runner, same trials, same sandbox, one invocation.

    .venv/bin/python benchmarks/sweep_vs_harbor.py --rows 500 --concurrency 4

Starts a Prefect server once (its start-up is not counted), then runs, each in a fresh child
process of this script, on the same N trials of the example oracle tasks (dataset mode, the
quick tasks in turn, as ``sweep_overhead.py`` builds them) in the same container sandbox
(``EnvironmentConfig(import_path=prefect_harbor.sandbox.container:ContainerEnvironment)``)
at the same concurrency:

  (a) harbor's job runner: ``Job.create(JobConfig(tasks=[N local tasks], n_concurrent_trials=C,
      retry.max_retries=0, quiet=True))`` then ``job.run()`` (what ``harbor run`` does);
  (b) ``evaluation_sweep`` over an N-row dataset, against the Prefect server.

Wall time is measured inside each child from the call to the return (imports and building
the dataset/config excluded). Afterwards the server is asked how many task runs it recorded
for the sweep's flow run (now, and again once the count settles), and its log is searched
for dropped events.

Per-row orchestration overhead (``overhead_ms``) is defined as
``(sweep wall - harbor wall) / N``: harbor's wall on the same trials stands for "the trial
time" at this concurrency. Subtracting the sweep's own trial time instead would hide
overhead, because on 2 cores the flow's CPU slows the trials themselves; that second
figure, ``(sweep wall - sum of trial time / C) / N``, is printed too.
``peak_rss_mb`` is VmHWM of the sweep's child process (the flow process).

Each child samples its event loop's lag (a 100 ms sleep, how late it wakes) throughout.
The last line is ``ratio=<sweep/harbor wall> overhead_ms=<...> peak_rss_mb=<...>
loop_p99_ms=<the sweep's loop lag p99>``.
Options: ``--interleave`` (each runner's rows in two halves, Harbor, sweep, sweep, Harbor, the
sweep's halves batched as the whole would be; their figures add up), ``--rows-per-task-run K``
(the sweep's batching; default its own), ``--attempts K`` (each row K times: Harbor's ``n_attempts``, the sweep's ``attempts``; the
per-row figures are then per trial, and both runners' pass@k are printed), ``--skip-harbor``, ``--profile FILE`` (pyinstrument on the sweep's event-loop
thread, must be installed), ``--cancel-after S`` (SIGTERM the sweep after S seconds and
time its exit), ``--settle S`` (how long to wait for the server's task-run count).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_overhead import QUICK_TASKS, TASKS, row_tasks, sweep_backend, write_dataset  # noqa: E402

from prefect_harbor.sandbox import IMPORT_PATH, ContainerEnvironment  # noqa: E402

#: The event-loop lag samplers' sleep, seconds.
LAG_INTERVAL = 0.1
#: Server log lines that mean an event (and so possibly a task-run record) was lost.
DROP_MARKERS = ("dropping", "queue is full", "Max flush retries")


# ------------------------------------------------------------------ child processes


def proc_status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return math.nan


def thread_cpu() -> dict[str, float]:
    """CPU seconds per live thread name (numbers stripped); the rest was spent by exited threads."""
    tick = os.sysconf("SC_CLK_TCK")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    seen: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        name = "".join(c for c in thread.name if not c.isdigit()).rstrip("-_ ") or "thread"
        seen[name] = seen.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    seen["(exited threads)"] = max(0.0, total - sum(seen.values()))
    return {"(process total)": total, **dict(sorted(seen.items(), key=lambda item: -item[1]))}


def sample_rss(interval: float = 1.0) -> list[float]:
    """VmRSS every ``interval`` seconds for the rest of the process: is memory flat as rows finish?"""
    samples: list[float] = []

    def sample() -> None:
        while True:
            samples.append(proc_status_mb("VmRSS"))
            time.sleep(interval)

    threading.Thread(target=sample, name="rss-sampler", daemon=True).start()
    return samples


def watch_first_sandbox() -> list[float]:
    """Patch the sandbox's start so the first trial's start time (epoch) is recorded."""
    first: list[float] = []
    original = ContainerEnvironment.start

    async def start(self, *args, **kwargs):
        if not first:
            first.append(time.time())
        return await original(self, *args, **kwargs)

    ContainerEnvironment.start = start
    return first


async def run_harbor(spec: dict) -> dict:
    from harbor.job import Job
    from harbor.models.job.config import JobConfig, RetryConfig
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig

    scratch, tasks_dir = Path(spec["scratch"]), Path(spec["tasks_dir"])
    config = JobConfig(
        job_name="bench", jobs_dir=scratch / "harbor-jobs", n_concurrent_trials=spec["concurrency"], quiet=True, n_attempts=spec.get("attempts", 1),
        retry=RetryConfig(max_retries=0), environment=EnvironmentConfig(import_path=IMPORT_PATH),
        agents=[AgentConfig(name="oracle")],
        tasks=[TaskConfig(path=tasks_dir / name) for name in row_tasks(spec["rows"], spec["task_names"])],
    )  # fmt: skip
    began = time.perf_counter()
    job = await Job.create(config)
    result = await job.run()
    wall = time.perf_counter() - began
    trials = result.trial_results
    return {
        "wall_s": wall,
        "trials": len(trials),
        "trial_sum_s": sum((t.finished_at - t.started_at).total_seconds() for t in trials if t.started_at and t.finished_at),
        "not_verified": sum(1 for t in trials if t.verifier_result is None),
        "pass_at_k": {k: v for stats in result.stats.evals.values() for k, v in stats.pass_at_k.items()},
    }


async def run_sweep(spec: dict) -> dict:
    import pyarrow.parquet as pq

    from prefect_harbor.flows.sweep import evaluation_sweep

    scratch, rows = Path(spec["scratch"]), spec["rows"]
    dataset = write_dataset(scratch / "dataset.jsonl", rows, spec["task_names"])
    backend = sweep_backend(spec["concurrency"], scratch / "sweep-trials", Path(spec["tasks_dir"]))
    began = time.perf_counter()
    state = await evaluation_sweep(
        dataset=str(dataset), backend=backend, results=str(scratch / "results"), rows_per_task_run=spec.get("rows_per_task_run"),
        attempts=spec.get("attempts", 1), return_state=True,
    )  # fmt: skip
    wall = time.perf_counter() - began
    summary = await state.result(raise_on_failure=False)
    table = pq.read_table(summary.results_uri.removeprefix("file://"), columns=["status", "total_sec"]).to_pydict()
    return {
        "wall_s": wall,
        "state": state.type.value,
        "flow_run_id": str(state.state_details.flow_run_id),
        "rows_written": len(table["status"]),
        "statuses": {status: table["status"].count(status) for status in set(table["status"])},
        "trial_sum_s": sum(t for t in table["total_sec"] if t is not None),
        "pass_at_k": summary.statistics.pass_at_k if summary.statistics else {},
    }


def sample_loop_lag(lag_ms: list[float], until: float = math.inf, before_sleep: Callable[[float], None] | None = None) -> asyncio.Task:
    """On the running loop, sleep ``LAG_INTERVAL`` again and again (until ``until``, a
    ``perf_counter`` time) and append how late each wake-up came, in ms; ``before_sleep`` is
    told when each sleep began."""

    async def sample() -> None:
        while (began := time.perf_counter()) < until:
            if before_sleep is not None:
                before_sleep(began)
            await asyncio.sleep(LAG_INTERVAL)
            lag_ms.append((time.perf_counter() - began - LAG_INTERVAL) * 1000)

    return asyncio.create_task(sample(), name="loop-lag-sampler")


async def with_loop_lag(runner, spec: dict) -> dict:
    """The runner's result, with ``lag_ms``: how late each 100 ms sleep on its event loop woke."""
    lag: list[float] = []
    sampler = sample_loop_lag(lag)
    try:
        return {**await runner(spec), "lag_ms": lag}
    finally:
        sampler.cancel()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def child(mode: str, spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    import harbor.job  # noqa: F401  (the runners' imports are not part of the run)

    import prefect_harbor.flows.sweep  # noqa: F401

    first = watch_first_sandbox()
    baseline_rss = proc_status_mb("VmRSS")
    rss_samples = sample_rss()
    started_epoch = time.time()
    runner = run_harbor if mode == "harbor" else run_sweep
    profiler = None
    if spec.get("profile"):
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005, async_mode="disabled")
        profiler.start()
    result = asyncio.run(with_loop_lag(runner, spec))
    if profiler is not None:
        profiler.stop()
        Path(spec["profile"]).write_text(profiler.output_text(unicode=False, color=False, show_all=False))
        Path(spec["profile"]).with_suffix(".html").write_text(profiler.output_html())
        profiler.last_session.save(Path(spec["profile"]).with_suffix(".pyisession"))
    result.update(
        started_epoch=started_epoch,
        first_trial_s=(first[0] - started_epoch) if first else None,
        first_trial_epoch=first[0] if first else None,
        baseline_rss_mb=baseline_rss,
        peak_rss_mb=proc_status_mb("VmHWM"),
        rss_by_quarter_mb=[rss_samples[min(len(rss_samples) - 1, len(rss_samples) * q // 4)] for q in (1, 2, 3, 4)] if rss_samples else [],
        cpu_s=thread_cpu(),
        process_cpu_s=(lambda u: u.ru_utime + u.ru_stime)(resource.getrusage(resource.RUSAGE_SELF)),
        children_cpu_s=(lambda u: u.ru_utime + u.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN)),
    )
    (spec_path.parent / f"{mode}.json").write_text(json.dumps(result))


# ------------------------------------------------------------------ the invocation


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def prefect_server(home: Path, log: Path, timeout: float = 240.0):
    """``prefect server start`` on a fresh database in ``home``, output to ``log``; yields the API URL."""
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api"
    try:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prefect server exited ({process.returncode}): {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not answer in {timeout:.0f} s")
            time.sleep(0.2)
        yield api, process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def session_cpu(session_id: int) -> float:
    """CPU seconds used so far by the live processes of a session (the Prefect server's)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id:
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_child(mode: str, spec: dict, env: dict[str, str], cancel_after: float | None = None) -> dict:
    scratch = Path(spec["scratch"])
    spec_path = scratch / f"{mode}-spec.json"
    spec_path.write_text(json.dumps(spec))
    log = scratch / f"{mode}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, __file__, "--child", mode, str(spec_path)], env=env, stdout=out, stderr=subprocess.STDOUT)
    cancel: dict = {}
    if cancel_after is not None:
        try:
            process.wait(timeout=cancel_after)
        except subprocess.TimeoutExpired:
            signalled = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            process.wait()
            cancel = {"cancel_exit_s": time.perf_counter() - signalled}
    process.wait()
    result_path = scratch / f"{mode}.json"
    if process.returncode != 0 and not result_path.exists():
        raise RuntimeError(f"{mode} child failed ({process.returncode}); log {log}:\n{log.read_text()[-3000:]}")
    return {**json.loads(result_path.read_text()), **cancel}


def server_check(api: str, flow_run_id: str, settle: float, log: Path) -> dict:
    """Task runs the server recorded for the flow run, right away and once the count is stable
    (consistent: the same count, all COMPLETED)."""
    import httpx

    with httpx.Client(base_url=api, timeout=60) as client:

        def count(state_types: list[str] | None = None, name: str | None = None) -> int:
            body: dict = {"flow_runs": {"id": {"any_": [flow_run_id]}}, "task_runs": {}}
            if state_types:
                body["task_runs"]["state"] = {"type": {"any_": state_types}}
            if name:
                body["task_runs"]["name"] = {"like_": name}
            response = client.post("/task_runs/count", json=body)
            response.raise_for_status()
            return response.json()

        at_end, began = count(), time.perf_counter()
        history = [count(["COMPLETED"])]

        def settled() -> bool:
            return history[-1] == at_end or (len(history) >= 5 and len(set(history[-5:])) == 1 and time.perf_counter() - began > 30)

        while time.perf_counter() - began < settle and not settled():
            time.sleep(2)
            history.append(count(["COMPLETED"]))
        flow_run = client.get(f"/flow_runs/{flow_run_id}").json()
        return {
            "task_runs_at_end": at_end,
            "task_runs": count(),
            "completed": history[-1],
            "not_final": count(["PENDING", "RUNNING", "SCHEDULED"]),
            "row_runs": count(name="row"),
            "settle_s": time.perf_counter() - began,
            "flow_run_state": flow_run["state"]["type"],
            "flow_run_start": flow_run.get("start_time"),
            "dropped_event_lines": sum(1 for line in log.read_text(errors="replace").splitlines() if any(m in line for m in DROP_MARKERS)),
        }


def merge_checks(checks: list[dict]) -> dict:
    """The server's figures over a runner's sweeps (halves): task-run counts add up, states join;
    the rest (the first flow run's start, the log's dropped events) are the first sweep's."""
    merged = {**checks[0], **{key: sum(c[key] for c in checks) for key in ("task_runs_at_end", "task_runs", "completed", "not_final", "row_runs")}}
    merged["flow_run_state"] = "/".join(c["flow_run_state"] for c in checks)
    return merged


def epoch(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def phases(rows: int, interleave: bool) -> list[tuple[str, int]]:
    """The runs of one comparison, in order: Harbor then the sweep, or with ``interleave`` each
    runner's rows in two halves, Harbor, sweep, sweep, Harbor (ABBA), so a load that drifts
    during the invocation weighs on both runners alike."""
    if not interleave:
        return [("harbor", rows), ("sweep", rows)]
    first, second = rows // 2, rows - rows // 2
    return [("harbor", first), ("sweep", first), ("sweep", second), ("harbor", second)]


def merge(parts: list[dict]) -> dict:
    """One runner's figures over its halves: times, counts and CPU add up, peaks are maxima."""
    if len(parts) == 1:
        return parts[0]
    added = ("wall_s", "trial_sum_s", "trials", "not_verified", "rows_written", "process_cpu_s", "children_cpu_s", "server_cpu_s")
    merged = {**parts[0], **{key: sum(p[key] for p in parts) for key in added if key in parts[0]}}
    merged["peak_rss_mb"] = max(p["peak_rss_mb"] for p in parts)
    cpu = {name: sum(p["cpu_s"].get(name, 0.0) for p in parts) for name in {n for p in parts for n in p["cpu_s"]}}
    merged["cpu_s"] = dict(sorted(cpu.items(), key=lambda item: -item[1]))
    merged["rss_by_quarter_mb"] = parts[-1].get("rss_by_quarter_mb", [])
    merged["lag_ms"] = [value for p in parts for value in p.get("lag_ms", [])]
    if "statuses" in parts[0]:
        merged["statuses"] = {s: sum(p["statuses"].get(s, 0) for p in parts) for s in {s for p in parts for s in p["statuses"]}}
        merged["state"] = "/".join(p["state"] for p in parts)
    return merged


def main(arguments: argparse.Namespace) -> None:
    rows, concurrency = arguments.rows, arguments.concurrency
    scratch = Path(tempfile.mkdtemp(prefix="sweep-vs-harbor-", dir=arguments.scratch))
    base_spec = {"rows": rows, "concurrency": concurrency, "tasks_dir": str(arguments.tasks.resolve()), "task_names": arguments.task, "attempts": arguments.attempts}
    rows_per_task_run = arguments.rows_per_task_run
    if arguments.interleave and rows_per_task_run is None:  # each half batches as the whole sweep would
        from prefect_harbor.flows.lanes import default_rows_per_task_run

        rows_per_task_run = default_rows_per_task_run(rows, concurrency)
    print(f"{rows} rows × {arguments.attempts} attempts over {', '.join(arguments.task)} (oracle, dataset mode), concurrency {concurrency}, scratch {scratch}"
          + (f"; interleaved (ABBA), {rows_per_task_run} rows per task run" if arguments.interleave else ""))  # fmt: skip
    print(f"load average before: {load()}")
    try:
        began = time.perf_counter()
        with prefect_server(scratch / "prefect-home", scratch / "server.log") as (api, server_pid):
            print(f"Prefect server up in {time.perf_counter() - began:.1f} s (not counted): {api}")
            env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(scratch / "client-home")}
            runs: dict[str, list[dict]] = {"harbor": [], "sweep": []}
            for n, (mode, part_rows) in enumerate(phases(rows, arguments.interleave)):
                if mode == "harbor" and arguments.skip_harbor:
                    continue
                part = scratch / f"{n}-{mode}"
                part.mkdir()
                spec = {**base_spec, "rows": part_rows, "scratch": str(part)}
                if mode == "sweep":
                    spec |= {"profile": str(arguments.profile.resolve()) if arguments.profile else None, "rows_per_task_run": rows_per_task_run}
                cpu = session_cpu(server_pid)
                result = run_child(mode, spec, env, arguments.cancel_after if mode == "sweep" else None)
                result["server_cpu_s"] = session_cpu(server_pid) - cpu
                runs[mode].append(result)
                print(f"{mode}, {part_rows} rows: {result['wall_s']:.1f} s, load {load()}", flush=True)
            server = merge_checks([server_check(api, part["flow_run_id"], arguments.settle, scratch / "server.log") for part in runs["sweep"]])
        harbor = merge(runs["harbor"]) if runs["harbor"] else None
        report(rows * arguments.attempts, concurrency, harbor, merge(runs["sweep"]), server)
    finally:
        if arguments.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def report(rows: int, concurrency: int, harbor: dict | None, sweep: dict, server: dict) -> None:
    def row(label: str, key: str, fmt: str = "{:.2f}") -> None:
        cells = [fmt.format(r[key]) if r is not None and r.get(key) is not None else "-" for r in (harbor, sweep)]
        print(f"{label:<32}{cells[0]:>12}{cells[1]:>12}")

    print(f"{'':<32}{'harbor Job':>12}{'sweep':>12}")
    row("wall s", "wall_s")
    for result in (harbor, sweep):
        if result is not None:
            result["ms_per_row"] = result["wall_s"] / rows * 1000
    row("ms per row (wall / N)", "ms_per_row", "{:.0f}")
    row("sum of trial time s", "trial_sum_s")
    row("first sandbox start s", "first_trial_s")
    row("process CPU s", "process_cpu_s")
    row("sandbox (children) CPU s", "children_cpu_s")
    row("Prefect server CPU s", "server_cpu_s")
    row("RSS before run MB", "baseline_rss_mb", "{:.0f}")
    row("peak RSS (VmHWM) MB", "peak_rss_mb", "{:.0f}")
    for result in (harbor, sweep):
        if result is not None:
            result["lag_p50_ms"], result["lag_p99_ms"] = percentile(result["lag_ms"], 0.5), percentile(result["lag_ms"], 0.99)
    row("event-loop lag p50 ms", "lag_p50_ms", "{:.1f}")
    row("event-loop lag p99 ms", "lag_p99_ms", "{:.1f}")
    if harbor:
        print(f"harbor: {harbor['trials']} trials, {harbor['not_verified']} without a verifier result")
    for name, result in (("harbor", harbor), ("sweep", sweep)):
        if result is not None and result.get("pass_at_k"):
            print(f"{name} pass@k: " + ", ".join(f"pass@{k} {v:.3f}" for k, v in sorted(result["pass_at_k"].items(), key=lambda item: int(item[0]))))
    print(f"sweep: flow run {sweep['flow_run_id']} {sweep['state']}, {sweep['rows_written']} rows written {sweep['statuses']}")
    if "cancel_exit_s" in sweep:
        print(f"sweep cancelled by SIGTERM: process exited {sweep['cancel_exit_s']:.2f} s after the signal")
    if sweep.get("rss_by_quarter_mb"):
        print("sweep RSS at 25/50/75/100 % of the run MB: " + " / ".join(f"{mb:.0f}" for mb in sweep["rss_by_quarter_mb"]))
    print("sweep CPU by thread: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in sweep["cpu_s"].items()))
    flow_start = epoch(server["flow_run_start"])
    if flow_start and sweep.get("first_trial_epoch"):
        print(f"flow run started {flow_start - sweep['started_epoch']:.2f} s after the call; first sandbox {sweep['first_trial_epoch'] - flow_start:.2f} s after the "
            f"flow run started")
    print(
        f"server: {server['task_runs_at_end']} task runs recorded when the sweep returned, {server['task_runs']} after {server['settle_s']:.0f} s "
        f"({server['completed']} COMPLETED, {server['not_final']} not final; {server['row_runs']} holding rows ('row …' / 'rows from …'), "
        f"the rest inspect-dataset and prewarm per task); "
        f"flow run {server['flow_run_state']}; {server['dropped_event_lines']} dropped-event log lines"
    )
    ratio = sweep["wall_s"] / harbor["wall_s"] if harbor else math.nan
    overhead_ms = (sweep["wall_s"] - harbor["wall_s"]) / rows * 1000 if harbor else math.nan
    by_trial_time = (sweep["wall_s"] - sweep["trial_sum_s"] / concurrency) / rows * 1000
    print(f"overhead per row: {overhead_ms:.1f} ms vs harbor's wall; {by_trial_time:.1f} ms vs the sweep's own trial time / {concurrency}")
    print(f"load average after: {load()}")
    print(f"ratio={ratio:.3f} overhead_ms={overhead_ms:.1f} peak_rss_mb={sweep['peak_rss_mb']:.0f} loop_p99_ms={sweep['lag_p99_ms']:.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tasks", type=Path, default=TASKS, help="a folder of Harbor tasks (dataset mode)")
    parser.add_argument("--task", action="append", help=f"task names in it, used in turn (default: {' '.join(QUICK_TASKS)})")
    parser.add_argument("--skip-harbor", action="store_true", help="only the sweep (profiling, cancellation)")
    parser.add_argument("--rows-per-task-run", type=int, help="the sweep's rows_per_task_run (default: its own)")
    parser.add_argument("--profile", type=Path, help="write a pyinstrument profile of the sweep here (.txt and .html)")
    parser.add_argument("--cancel-after", type=float, help="SIGTERM the sweep after this many seconds; time its exit")
    parser.add_argument("--settle", type=float, default=120.0, help="seconds to wait for the server's task-run count")
    parser.add_argument("--scratch", type=Path, help="parent folder for trials, results and the server database")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--attempts", type=int, default=1, help="trials per row: Harbor's n_attempts, the sweep's attempts (figures are per trial)")
    parser.add_argument("--interleave", action="store_true", help="each runner's rows in two halves, in the order Harbor, sweep, sweep, Harbor")
    arguments = parser.parse_args()
    arguments.task = arguments.task or QUICK_TASKS
    main(arguments)
