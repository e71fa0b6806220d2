"""Model-backed rows: terminus-2 against a model with latency, the sweep against Harbor's Job.

    .venv/bin/python benchmarks/model_backed.py --rows 200 --concurrency 16,32 --latency 1.0 --interleave

Real sweeps hold an agent for minutes per row, many at once, and terminus-2's loop runs in
the sweep's own process: this is that shape, on the one fake part (the model). One
invocation starts

* the scripted model server (``prefect_harbor.testing.model_server``) in a process of its own,
  replying with ``examples/model-scripts/terminus-2-multi-key-reward.json`` (ten turns)
  after ``--latency`` seconds (plus ``--jitter``, seeded) per completion;
* a Prefect server (``prefect server start``, fresh SQLite database; start-up not counted),

then, for each concurrency C, in fresh child processes of this script, the same N
terminus-2 rows of ``examples/tasks/multi-key-reward`` (a copy whose agent timeout is
``--agent-timeout``: under load a 60 s budget would measure timeouts, not throughput) in
the same container sandbox (``prefect_harbor.sandbox.container:ContainerEnvironment``):

  (a) Harbor's ``Job`` (``n_concurrent_trials=C``, no retries), the agent wired by
      ``native_agent_config`` exactly as the sweep wires it;
  (b) ``evaluation_sweep`` over an N-row dataset with ``n_concurrent=C``.

Figures per runner: wall (call to return), rows per minute and the ideal
``C * 60 / mean trial seconds`` (how full the C lanes were kept), event-loop lag (a
coroutine on the runner's own loop sleeps 100 ms and records how late it wakes; p50, p99,
max; whether every trial started on that loop is checked; beside it, as a control, the lag
of this idle parent process sleeping 100 ms at the same time, and how busy the loop's thread
was: its CPU over the wall), peak RSS (VmHWM) and
``(peak - RSS before the run) / C`` per concurrent agent, process CPU, the containers'
CPU, the Prefect server's CPU (its session's processes) and the model server's. After each
sweep the Prefect API is asked what the sweep left on the server per row: events by name,
log records, artifacts, task runs.

``ratio`` = sweep wall / Harbor wall and ``overhead_ms`` = (sweep wall - Harbor wall) / N
come from the same invocation; the last line, per concurrency, is
``ratio=… overhead_ms=… peak_rss_mb=… loop_p99_ms=…`` (the sweep's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_vs_harbor import (  # noqa: E402
    LAG_INTERVAL,
    load,
    merge_checks,
    percentile,
    phases,
    prefect_server,
    proc_status_mb,
    sample_loop_lag,
    sample_rss,
    server_check,
    session_cpu,
    thread_cpu,
)

from prefect_harbor.sandbox import IMPORT_PATH, ContainerEnvironment  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TASK = "multi-key-reward"
SCRIPT = REPO / "examples" / "model-scripts" / f"terminus-2-{TASK}.json"
MODEL = "scripted"
KEY_VARIABLE = "BENCH_MODEL_API_KEY"  # a throwaway key for the fake model, never printed


# ------------------------------------------------------------------ child processes


class StallWatch:
    """What holds the loop when it is late: the loop thread's stack, sampled every 10 ms while the
    lag sampler is more than ``late`` seconds past its wake-up (``--stalls``).

    Counts are time-weighted (one per 10 ms of stall). A loop thread caught in ``select`` while
    late was not holding the loop: it waited for a core or for the GIL, and the innermost
    frames of the other threads, counted beside it, say who had the GIL.
    """

    def __init__(self, late: float = 0.05, every: float = 0.01):
        self.late, self.every = late, every
        self.deadline = float("inf")
        self.loop_thread = threading.get_ident()
        self.stacks: Counter[tuple[str, ...]] = Counter()
        self.others: Counter[str] = Counter()
        threading.Thread(target=self._watch, name="stall-watch", daemon=True).start()

    def expect(self, wake: float) -> None:
        self.deadline = wake + self.late

    def _watch(self) -> None:
        me = threading.get_ident()
        while True:
            time.sleep(self.every)
            if time.perf_counter() <= self.deadline:
                continue
            frames = sys._current_frames()
            if (loop_frame := frames.get(self.loop_thread)) is not None:
                self.stacks[tuple(where(frame) for frame, _ in traceback.walk_stack(loop_frame))[:12]] += 1
            for ident, frame in frames.items():
                if ident not in (me, self.loop_thread):
                    self.others[where(frame)] += 1

    def top(self, n: int = 12) -> dict[str, Any]:
        return {
            "samples": sum(self.stacks.values()),
            "loop_stacks": [[count, list(stack)] for stack, count in self.stacks.most_common(n)],
            "other_threads": self.others.most_common(n),
        }


class GcPauses:
    """Every garbage collection's pause, by generation: a full collection stops the loop with the
    GIL held, so no stack sampler can see it."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._began = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses[info["generation"]].append((time.perf_counter() - self._began) * 1000)

    def figures(self) -> dict[str, dict[str, float]]:
        return {
            f"gen{generation}": {"count": len(ms), "total_ms": sum(ms), "max_ms": max(ms, default=0.0), "over_50ms": sum(1 for m in ms if m > 50)}
            for generation, ms in self.pauses.items()
        }


def where(frame) -> str:
    """``package/module.py:line function`` for a frame, the path cut at site-packages or the repo."""
    path = frame.f_code.co_filename
    for marker in ("site-packages/", str(REPO) + "/", "lib/python3.12/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"


def watch_loop(lag: list[float], on_loop: list[bool], stalls: StallWatch | None = None) -> asyncio.Task:
    """Sample the running loop's lag every 100 ms (ms, into ``lag``); note for each trial whether it started on it.

    A trial started on another loop (a thread, a worker) would leave this sampler blind to
    its agent's work, so the check goes with the figure.
    """
    loop = asyncio.get_running_loop()
    original = ContainerEnvironment.start

    async def start(self, *args, **kwargs):
        on_loop.append(asyncio.get_running_loop() is loop)
        return await original(self, *args, **kwargs)

    ContainerEnvironment.start = start
    return sample_loop_lag(lag, before_sleep=None if stalls is None else lambda began: stalls.expect(began + LAG_INTERVAL))


def endpoint(spec: dict):
    from prefect_harbor.blocks import ModelEndpoint

    return ModelEndpoint(base_url=spec["base_url"], api_key=os.environ[KEY_VARIABLE])


async def run_harbor(spec: dict) -> dict:
    from harbor.job import Job
    from harbor.models.job.config import JobConfig, RetryConfig
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig

    from prefect_harbor.agents.native import native_agent_config

    agent = native_agent_config("terminus-2", MODEL, endpoint(spec).spec()).agent
    config = JobConfig(
        job_name="bench", jobs_dir=Path(spec["scratch"]) / "harbor-jobs", n_concurrent_trials=spec["concurrency"], quiet=True,
        retry=RetryConfig(max_retries=0), environment=EnvironmentConfig(import_path=IMPORT_PATH), agents=[agent],
        tasks=[TaskConfig(path=Path(spec["tasks_dir"]) / TASK) for _ in range(spec["rows"])],
    )  # fmt: skip
    began = time.perf_counter()
    result = await (await Job.create(config)).run()
    wall = time.perf_counter() - began
    trials = result.trial_results
    return {
        "wall_s": wall,
        "trial_s": [(t.finished_at - t.started_at).total_seconds() for t in trials if t.started_at and t.finished_at],
        "rewarded": sum(1 for t in trials if t.verifier_result and (t.verifier_result.rewards or {}).get("reward") == 1),
        "errors": sorted({t.exception_info.exception_type for t in trials if t.exception_info}),
    }


async def run_sweep(spec: dict) -> dict:
    import pyarrow.parquet as pq

    from prefect_harbor.blocks import HarborBackend
    from prefect_harbor.flows.sweep import evaluation_sweep

    scratch, rows = Path(spec["scratch"]), spec["rows"]
    dataset = scratch / "dataset.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"r{n}", "metadata": {"harbor_task_id": TASK}}) + "\n" for n in range(rows)))
    backend = HarborBackend(
        tasks_dir=Path(spec["tasks_dir"]), task_mode="dataset", agent="terminus-2", model_name=MODEL, model_endpoint=endpoint(spec),
        n_concurrent=spec["concurrency"], trials_dir=str(scratch / "trials"),
    )  # fmt: skip
    began = time.perf_counter()
    state = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(scratch / "results"), return_state=True)
    wall = time.perf_counter() - began
    summary = await state.result(raise_on_failure=False)
    table = pq.read_table(summary.results_uri.removeprefix("file://"), columns=["status", "reward", "total_sec"]).to_pydict()
    return {
        "wall_s": wall,
        "flow_run_id": str(state.state_details.flow_run_id),
        "state": state.type.value,
        "trial_s": [t for t in table["total_sec"] if t is not None],
        "rewarded": sum(1 for r in table["reward"] if r == 1),
        "statuses": {s: table["status"].count(s) for s in set(table["status"])},
    }


def child(mode: str, spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    import harbor.agents.terminus_2  # noqa: F401  (imports, litellm's included, are not the run's)
    import harbor.job  # noqa: F401
    import litellm  # noqa: F401

    import prefect_harbor.flows.sweep  # noqa: F401

    baseline_rss = proc_status_mb("VmRSS")
    rss = sample_rss()
    lag: list[float] = []
    on_loop: list[bool] = []
    stalls = StallWatch() if spec.get("stalls") else None
    collections = GcPauses()

    async def measured() -> dict:
        sampler = watch_loop(lag, on_loop, stalls)
        try:
            return await (run_harbor if mode == "harbor" else run_sweep)(spec)
        finally:
            sampler.cancel()

    started = time.time()
    result = asyncio.run(measured())
    usage = os.times()
    result.update(
        started_epoch=started,
        finished_epoch=time.time(),
        baseline_rss_mb=baseline_rss,
        peak_rss_mb=proc_status_mb("VmHWM"),
        steady_rss_mb=statistics.median(rss[len(rss) // 4 : max(len(rss) // 4 + 1, 3 * len(rss) // 4)]) if rss else None,
        lag_ms=lag,
        trials_started=len(on_loop),
        trials_on_sampled_loop=sum(on_loop),
        cpu_s=thread_cpu(),
        process_cpu_s=usage.user + usage.system,
        children_cpu_s=usage.children_user + usage.children_system,
    )
    result["gc"] = collections.figures()
    if stalls is not None:
        result["stalls"] = stalls.top()
    (spec_path.parent / f"{mode}.json").write_text(json.dumps(result))


def run_child(mode: str, spec: dict, env: dict[str, str]) -> dict:
    """Run one runner in a fresh process; beside it, this (idle) process samples its own sleep lag.

    That control tells the machine's scheduling delay (other processes on two cores) from
    lag the runner's loop causes itself.
    """
    scratch = Path(spec["scratch"])
    scratch.mkdir(parents=True, exist_ok=True)
    spec_path = scratch / f"{mode}-spec.json"
    spec_path.write_text(json.dumps(spec))
    log = scratch / f"{mode}.log"
    control: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            began = time.perf_counter()
            time.sleep(LAG_INTERVAL)
            control.append((time.perf_counter() - began - LAG_INTERVAL) * 1000)

    sampler = threading.Thread(target=sample, name="control-lag", daemon=True)
    sampler.start()
    with log.open("wb") as out:
        returncode = subprocess.call([sys.executable, __file__, "--child", mode, str(spec_path)], env=env, stdout=out, stderr=subprocess.STDOUT)
    done.set()
    sampler.join()
    if returncode != 0 or not (scratch / f"{mode}.json").exists():
        raise RuntimeError(f"{mode} child failed ({returncode}); log {log}:\n{log.read_text()[-3000:]}")
    return {**json.loads((scratch / f"{mode}.json").read_text()), "control_lag_ms": control}


# ------------------------------------------------------------------ the invocation


def benchmark_task(tasks_dir: Path, agent_timeout: float) -> None:
    """A copy of the example task with a longer agent budget (same environment, same image)."""
    shutil.copytree(REPO / "examples" / "tasks" / TASK, tasks_dir / TASK)
    toml = tasks_dir / TASK / "task.toml"
    text = toml.read_text()
    assert "[agent]\ntimeout_sec = 60.0" in text, "the example task's agent section changed"
    toml.write_text(text.replace("[agent]\ntimeout_sec = 60.0", f"[agent]\ntimeout_sec = {agent_timeout}"))


def start_model_server(latency: float, jitter: float, seed: int, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "prefect_harbor.testing.model_server", "--script", str(SCRIPT), "--api-key-env", KEY_VARIABLE]
    command += ["--latency", str(latency), "--jitter", str(jitter), "--seed", str(seed)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    base_url = process.stdout.readline().strip()
    if not base_url.startswith("http://127.0.0.1:"):
        process.kill()
        raise RuntimeError(f"the model server did not start (said {base_url!r})")
    return process, base_url


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def server_footprint(api: str, flow_run_id: str, since: float, until: float) -> dict[str, Any]:
    """What one sweep left on the Prefect server: events by name, log records, artifacts.

    The server stores events in batches after they arrive, so they are counted until two
    counts 5 s apart agree.
    """
    import httpx

    with httpx.Client(base_url=api, timeout=60) as client:
        window = {"occurred": {"since": iso(since - 5), "until": iso(until + 600)}, "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}

        def count_events() -> dict[str, int]:
            counts = client.post("/events/count-by/event", json={"filter": window, "time_unit": "day"})
            counts.raise_for_status()
            return {item["value"]: item["count"] for item in counts.json()}

        events, previous = count_events(), None
        while events != previous:
            time.sleep(5)
            previous, events = events, count_events()
        logs, offset = 0, 0
        while True:
            page = client.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200, "offset": offset})
            page.raise_for_status()
            logs += len(page.json())
            offset += 200
            if len(page.json()) < 200:
                break
        artifacts = client.post("/artifacts/count", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
        artifacts.raise_for_status()
    return {"events": events, "events_total": sum(events.values()), "logs": logs, "artifacts": artifacts.json()}


def summarize(result: dict, rows: int, concurrency: int) -> None:
    """Derived figures, in place: throughput against the ideal, lag percentiles, RSS per agent."""
    trial_mean = statistics.mean(result["trial_s"]) if result["trial_s"] else float("nan")
    result["trial_mean_s"] = trial_mean
    result["rows_per_min"] = rows / result["wall_s"] * 60
    result["ideal_rows_per_min"] = concurrency * 60 / trial_mean
    result["lag_p50_ms"] = percentile(result["lag_ms"], 0.50)
    result["lag_p99_ms"] = percentile(result["lag_ms"], 0.99)
    result["lag_max_ms"] = max(result["lag_ms"], default=float("nan"))
    result["control_lag_p99_ms"] = percentile(result["control_lag_ms"], 0.99)
    result["loop_busy_pct"] = result["cpu_s"].get("MainThread", float("nan")) / result["wall_s"] * 100
    result["rss_per_agent_mb"] = (result["peak_rss_mb"] - result["baseline_rss_mb"]) / concurrency


def report(rows: int, concurrency: int, harbor: dict, sweep: dict, footprint: dict, server: dict) -> None:
    def line(label: str, key: str, fmt: str = "{:.1f}") -> None:
        cells = [fmt.format(r[key]) if r.get(key) is not None else "-" for r in (harbor, sweep)]
        print(f"  {label:<40}{cells[0]:>12}{cells[1]:>12}")

    print(f"\n== {rows} terminus-2 rows at concurrency {concurrency}")
    print(f"  {'':<40}{'harbor Job':>12}{'sweep':>12}")
    line("wall s", "wall_s")
    line("mean trial s", "trial_mean_s")
    line("rows per minute", "rows_per_min")
    line("ideal rows/min (C*60/mean trial s)", "ideal_rows_per_min")
    line("rows rewarded 1", "rewarded", "{:d}")
    line("event-loop lag p50 ms", "lag_p50_ms")
    line("event-loop lag p99 ms", "lag_p99_ms")
    line("event-loop lag max ms", "lag_max_ms")
    line("control: an idle process's lag p99 ms", "control_lag_p99_ms")
    line("loop thread busy (its CPU / wall) %", "loop_busy_pct")
    line("RSS before the run MB", "baseline_rss_mb", "{:.0f}")
    line("RSS mid-run (median of 25-75 %) MB", "steady_rss_mb", "{:.0f}")
    line("peak RSS (VmHWM) MB", "peak_rss_mb", "{:.0f}")
    line("(peak - before) / C MB per agent", "rss_per_agent_mb")
    line("process CPU s", "process_cpu_s")
    line("containers' CPU (children) s", "children_cpu_s")
    line("Prefect server CPU s", "server_cpu_s")
    line("model server CPU s", "model_cpu_s")
    for name, result in (("harbor", harbor), ("sweep", sweep)):
        print(f"  {name}: {result['trials_on_sampled_loop']} of {result['trials_started']} trials started on the sampled loop; errors "
            f"{result.get('errors') or result.get('statuses')}")
    for name, result in (("harbor", harbor), ("sweep", sweep)):
        print(f"  {name} garbage collections: " + ", ".join(
            f"{gen} {f['count']:.0f} ({f['total_ms']:.0f} ms, max {f['max_ms']:.0f} ms, {f['over_50ms']:.0f} over 50 ms)" for gen, f in result["gc"].items()
        ))  # fmt: skip
    print("  sweep CPU by thread: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in sweep["cpu_s"].items()))
    print(
        f"  Prefect server per sweep: {footprint['events_total']} events ({footprint['events_total'] / rows:.2f}/row), "
        f"{footprint['logs']} log records ({footprint['logs'] / rows:.2f}/row), {footprint['artifacts']} artifacts, "
        f"{server['task_runs']} task runs ({server['row_runs']} holding rows); flow run {server['flow_run_state']}, "
        f"{server['dropped_event_lines']} dropped-event lines"
    )
    print("  events by name: " + ", ".join(f"{name} {count}" for name, count in sorted(footprint["events"].items(), key=lambda kv: -kv[1])))
    ratio = sweep["wall_s"] / harbor["wall_s"]
    overhead_ms = (sweep["wall_s"] - harbor["wall_s"]) / rows * 1000
    print(f"  throughput: sweep {sweep['rows_per_min'] / harbor['rows_per_min'] * 100:.1f} % of Harbor's; "
          f"of the ideal: harbor {harbor['rows_per_min'] / harbor['ideal_rows_per_min'] * 100:.1f} %, sweep "
              f"{sweep['rows_per_min'] / sweep['ideal_rows_per_min'] * 100:.1f} %")  # fmt: skip
    print(f"  load average: {harbor['load_before']} -> {harbor['load_after']} (harbor), {sweep['load_before']} -> {sweep['load_after']} (sweep)")
    print(f"ratio={ratio:.3f} overhead_ms={overhead_ms:.1f} peak_rss_mb={sweep['peak_rss_mb']:.0f} loop_p99_ms={sweep['lag_p99_ms']:.1f}")


def print_stalls(halves: dict[str, list[dict]], frames: int = 5) -> None:
    """Per runner and half: what the loop thread was doing while late, innermost frames first."""
    for mode, parts in halves.items():
        for n, part in enumerate(parts):
            stalls = part["stalls"]
            print(f"  stalls, {mode} part {n + 1}: {stalls['samples']} samples of 10 ms")
            for count, stack in stalls["loop_stacks"][:8]:
                print(f"    {count:>5}  " + "  <  ".join(stack[:frames]))
            print("    other threads: " + ", ".join(f"{name} {count}" for name, count in stalls["other_threads"][:6]))


def merge(parts: list[dict]) -> dict:
    """One runner's figures over its halves: times, counts and CPU add up, samples pool, peaks are maxima."""
    if len(parts) == 1:
        return parts[0]
    added = ("wall_s", "rewarded", "trials_started", "trials_on_sampled_loop", "process_cpu_s", "children_cpu_s", "server_cpu_s", "model_cpu_s")
    pooled = ("trial_s", "lag_ms", "control_lag_ms")
    merged = {key: sum(p[key] for p in parts) for key in added}
    merged |= {key: [value for p in parts for value in p[key]] for key in pooled}
    merged |= {
        "peak_rss_mb": max(p["peak_rss_mb"] for p in parts),
        "baseline_rss_mb": statistics.mean(p["baseline_rss_mb"] for p in parts),
        "steady_rss_mb": statistics.mean(p["steady_rss_mb"] for p in parts if p["steady_rss_mb"] is not None),
        "cpu_s": {name: sum(p["cpu_s"].get(name, 0.0) for p in parts) for name in {n for p in parts for n in p["cpu_s"]}},
        "load_before": " / ".join(p["load_before"] for p in parts),
        "load_after": " / ".join(p["load_after"] for p in parts),
        "errors": sorted({e for p in parts for e in p.get("errors") or []}),
        "gc": {
            gen: {"count": sum(p["gc"][gen]["count"] for p in parts), "total_ms": sum(p["gc"][gen]["total_ms"] for p in parts),
                  "max_ms": max(p["gc"][gen]["max_ms"] for p in parts), "over_50ms": sum(p["gc"][gen]["over_50ms"] for p in parts)}
            for gen in parts[0]["gc"]
        },
    }
    if "statuses" in parts[0]:
        merged["statuses"] = {s: sum(p["statuses"].get(s, 0) for p in parts) for s in {s for p in parts for s in p["statuses"]}}
    return merged


def main(arguments: argparse.Namespace) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="model-backed-", dir=arguments.scratch))
    print(f"{arguments.rows} terminus-2 rows of {TASK}, concurrency {arguments.concurrency}, latency {arguments.latency} s "
          f"+ jitter {arguments.jitter} s (seed {arguments.seed}); scratch {scratch}; load {load()}")  # fmt: skip
    env = {**os.environ, KEY_VARIABLE: secrets.token_hex(16)}
    benchmark_task(scratch / "tasks", arguments.agent_timeout)
    model, base_url = start_model_server(arguments.latency, arguments.jitter, arguments.seed, env)
    try:
        with prefect_server(scratch / "prefect-home", scratch / "server.log") as (api, server_pid):
            env = {**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(scratch / "client-home")}
            for concurrency in arguments.concurrency:
                spec = {"rows": arguments.rows, "concurrency": concurrency, "tasks_dir": str(scratch / "tasks"), "base_url": base_url, "stalls": arguments.stalls}
                halves: dict[str, list[dict]] = {"harbor": [], "sweep": []}
                for n, (mode, rows) in enumerate(phases(arguments.rows, arguments.interleave)):
                    before = (load(), session_cpu(server_pid), process_cpu(model.pid))
                    result = run_child(mode, {**spec, "rows": rows, "scratch": str(scratch / f"c{concurrency}" / f"{n}-{mode}")}, env)
                    result.update(load_before=before[0], load_after=load(), server_cpu_s=session_cpu(server_pid) - before[1], model_cpu_s=process_cpu(model.pid) - before[2])
                    halves[mode].append(result)
                    print(f"  {mode} at {concurrency}, {rows} rows: {result['wall_s']:.1f} s, load {before[0]} -> {result['load_after']}", flush=True)
                results = {mode: merge(parts) for mode, parts in halves.items()}
                for result in results.values():
                    summarize(result, arguments.rows, concurrency)
                sweep = results["sweep"]
                server = merge_checks([server_check(api, part["flow_run_id"], 60, scratch / "server.log") for part in halves["sweep"]])
                footprints = [server_footprint(api, part["flow_run_id"], part["started_epoch"], part["finished_epoch"]) for part in halves["sweep"]]
                footprint = {
                    "events": {name: sum(f["events"].get(name, 0) for f in footprints) for name in {n for f in footprints for n in f["events"]}},
                    **{key: sum(f[key] for f in footprints) for key in ("events_total", "logs", "artifacts")},
                }
                report(arguments.rows, concurrency, results["harbor"], sweep, footprint, server)
                if arguments.stalls:
                    print_stalls(halves)
                (scratch / f"c{concurrency}" / "figures.json").write_text(json.dumps({**results, "footprint": footprint, "server": server}))
    finally:
        model.terminate()
        model.wait(timeout=30)
        if arguments.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--concurrency", type=lambda text: [int(c) for c in text.split(",")], default=[16, 32], help="comma-separated, e.g. 16,32")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per completion")
    parser.add_argument("--jitter", type=float, default=0.0, help="plus up to this many seconds per completion (seeded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agent-timeout", type=float, default=900.0, help="the task copy's agent timeout_sec")
    parser.add_argument("--scratch", type=Path, help="parent folder for trials, results and the server database")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--stalls", action="store_true", help="sample the loop thread's stack while the loop is late (costs a little lag itself)")
    parser.add_argument("--interleave", action="store_true", help="each runner's rows in two halves, in the order Harbor, sweep, sweep, Harbor")
    main(parser.parse_args())
