"""Event-loop lag while many agents exec into their containers: podman started on the loop, or in a starter thread.

    .venv/bin/python benchmarks/engine_starts.py --agents 32 --seconds 60

Starting a process blocks the calling thread until the child has exec'd; ``sandbox/spawn.py``
moves that off the loop. This measures just that choice, in one process, on one set of
containers: ``--agents`` containers of the ``reward-txt`` example image (``podman run -d ...
sleep infinity``), one agent loop per container running ``podman exec <it> sh -c 'echo ok'``
then thinking ``--think`` seconds, as a terminus-2 turn's execs do. The two ways to start
``podman`` run in alternating phases (on the loop, in a thread, in a thread, on the loop:
ABBA), ``--seconds`` each, while a coroutine sleeping 100 ms records how late the loop wakes.
The execs themselves load the machine (podman, conmon and runc per exec), as a sweep's do.

Per way: loop lag p50/p99/max, execs per second, median exec time. The last line is
``ratio=<thread p99 / loop p99> overhead_ms=<thread - loop median exec ms> peak_rss_mb=…
loop_p99_ms=<thread p99>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HARBOR_TELEMETRY", "0")

import prefect_harbor  # noqa: E402,F401  (offline defaults before harbor is imported)
from prefect_harbor.sandbox.engine import engine_env, podman, podman_argv  # noqa: E402
from prefect_harbor.sandbox.images import image_resolver  # noqa: E402
from prefect_harbor.sandbox.spawn import start_engine_process  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_vs_harbor import load, percentile, proc_status_mb, sample_loop_lag  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "examples" / "tasks" / "reward-txt"


async def exec_on_loop(argv: list[str]) -> int:
    """asyncio's own subprocess support: the fork and exec happen on the loop's thread."""
    process = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=engine_env())
    await process.communicate()
    return process.returncode or 0


async def exec_in_thread(argv: list[str]) -> int:
    """The sandbox's way (``sandbox/spawn.py``): started in a starter thread, watched by the loop."""
    process = await start_engine_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=engine_env())
    await process.communicate()
    return process.returncode or 0


WAYS = {"on the loop": exec_on_loop, "in a thread": exec_in_thread}


async def phase(way: str, containers: list[str], seconds: float, think: float) -> dict:
    run = WAYS[way]
    lag: list[float] = []
    exec_s: list[float] = []
    failures = 0
    deadline = time.perf_counter() + seconds

    async def agent(container: str) -> None:
        nonlocal failures
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            if await run(podman_argv("exec", container, "sh", "-c", "echo ok")) != 0:
                failures += 1
            exec_s.append(time.perf_counter() - began)
            await asyncio.sleep(think)

    load_before = load()
    await asyncio.gather(sample_loop_lag(lag, until=deadline), *(agent(c) for c in containers))
    ordered = sorted(lag)
    return {
        "lag": lag, "exec_s": exec_s, "failures": failures, "seconds": seconds, "load": f"{load_before} -> {load()}",
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }  # fmt: skip


async def main(arguments: argparse.Namespace) -> None:
    ballast = [bytearray(1024 * 1024) for _ in range(arguments.ballast_mb)]  # the sweep's process size
    for block in ballast:
        block[::4096] = b"x" * len(block[::4096])
    image = await image_resolver().ensure_built(TASK / "environment", "reward-txt", timeout_sec=900)
    print(f"{arguments.agents} agents, {arguments.seconds:.0f} s per phase, think {arguments.think} s, image {image}, RSS {proc_status_mb('VmRSS'):.0f} MB; load {load()}")
    containers = []
    try:
        for _ in range(arguments.agents):
            started = await podman("run", "-d", "--init", "--network", "none", image, "sleep", "infinity", timeout=120)
            containers.append(started.check("run").text)
        results: dict[str, list[dict]] = {way: [] for way in WAYS}
        for way in ("on the loop", "in a thread", "in a thread", "on the loop"):
            result = await phase(way, containers, arguments.seconds, arguments.think)
            results[way].append(result)
            print(f"  {way}: lag p99 {result['p99']:.1f} ms, {len(result['exec_s']) / result['seconds']:.1f} execs/s, load {result['load']}", flush=True)
    finally:
        for container in containers:
            await podman("rm", "-f", "-t", "0", container, timeout=120)
    figures = {}
    print(f"\n{'':<28}{'on the loop':>14}{'in a thread':>14}")
    for way, parts in results.items():
        lag = [value for part in parts for value in part["lag"]]
        execs = [value for part in parts for value in part["exec_s"]]
        figures[way] = {
            "p50": percentile(lag, 0.5), "p99": percentile(lag, 0.99), "max": max(lag), "rate": len(execs) / sum(p["seconds"] for p in parts),
            "exec_ms": statistics.median(execs) * 1000, "failures": sum(p["failures"] for p in parts),
        }  # fmt: skip
    for label, key, fmt in (("loop lag p50 ms", "p50", "{:.1f}"), ("loop lag p99 ms", "p99", "{:.1f}"), ("loop lag max ms", "max", "{:.0f}"),
                            ("execs per second", "rate", "{:.1f}"), ("median exec ms", "exec_ms", "{:.0f}"), ("failed execs", "failures", "{:d}")):  # fmt: skip
        print(f"{label:<28}" + "".join(f"{fmt.format(figures[way][key]):>14}" for way in WAYS))
    on, off = figures["on the loop"], figures["in a thread"]
    print(f"ratio={off['p99'] / on['p99']:.3f} overhead_ms={off['exec_ms'] - on['exec_ms']:.1f} peak_rss_mb={proc_status_mb('VmHWM'):.0f} loop_p99_ms={off['p99']:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each of the four phases")
    parser.add_argument("--think", type=float, default=1.0, help="seconds an agent waits between its execs (the model's turn)")
    parser.add_argument("--ballast-mb", type=int, default=300, help="grow the process to about a sweep's size first")
    asyncio.run(main(parser.parse_args()))
