"""Prewarm at scale: 50 distinct task images through the product's prewarm flow.

    .venv/bin/python benchmarks/prewarm_scale.py --tasks 50 --parallel-builds 1,2,4

Generates ``--tasks`` small Harbor tasks, each with a Dockerfile of its own
(``FROM debian:bookworm-slim``, one distinct ``RUN echo``, so each is a cold build on
cached base layers), and, against one Prefect server (``prefect server start``, start-up
not counted), runs in fresh child processes the ``prewarm`` flow (``flows/prewarm.py``: the
same step a sweep runs first, an install-only oracle trial per task, ``n_concurrent`` at a
time, its image built through ``sandbox/images.py``'s build slots) over

1. one fresh set of tasks per ``--parallel-builds`` value B (the environment's
   ``max_parallel_builds``): the build wall-clock, bounded-parallel against B = 1 (one by
   one), same invocation;
2. the last set again: a second sweep's prewarm, which must build nothing (target < 5 s);
3. one task of that set with only its ``tests/test.sh`` changed: it must not be rebuilt
   (same image tag, no build log written by that prewarm).

Each set's tasks carry a token of this invocation in their Dockerfiles, so no image of an
earlier run is reused. Afterwards exactly the images these prewarms built are removed
(by tag), nothing else. The last line reads
``ratio=<parallel/one-by-one wall> overhead_ms=<second prewarm ms per task> peak_rss_mb=<...> loop_p99_ms=-``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_vs_harbor import load, prefect_server, proc_status_mb, session_cpu  # noqa: E402

TASK_TOML = """schema_version = "1.4"

[task]
name = "prefect-harbor/{name}"
description = "A generated task for benchmarks/prewarm_scale.py."

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 60.0

[environment]
build_timeout_sec = 600.0
"""


def make_tasks(root: Path, count: int, token: str) -> list[str]:
    """``count`` tasks under ``root``, each with its own Dockerfile; their names."""
    names = []
    for n in range(count):
        name = f"prewarm-{token}-{n:02d}"
        task = root / name
        (task / "environment").mkdir(parents=True)
        (task / "environment" / "Dockerfile").write_text(f"FROM debian:bookworm-slim\nRUN echo {name} > /prewarm-marker\nWORKDIR /app\n")
        (task / "task.toml").write_text(TASK_TOML.format(name=name))
        (task / "instruction.md").write_text("Nothing to do.\n")
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n")
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
        names.append(name)
    return names


# ------------------------------------------------------------------ child: one prewarm flow run


async def prewarm(spec: dict) -> dict:
    from prefect_harbor.blocks import HarborBackend
    from prefect_harbor.config import TrialEnvironment
    from prefect_harbor.flows.prewarm import prewarm_flow

    backend = HarborBackend(
        tasks_dir=Path(spec["tasks_dir"]), task_mode="dataset", agent="oracle", n_concurrent=spec["concurrency"],
        trials_dir=spec["trials_dir"], environment=TrialEnvironment(kwargs={"max_parallel_builds": spec["parallel_builds"]}),
    )  # fmt: skip
    began = time.perf_counter()
    results = await prewarm_flow(backend=backend, task_ids=spec["task_ids"])
    wall = time.perf_counter() - began
    return {
        "wall_s": wall,
        "ok": sum(r.ok for r in results),
        "errors": sorted({r.error for r in results if r.error})[:3],
        "built": sum(1 for r in results if r.build_log),  # a build log only when this prewarm built the image
        "images": {r.task: r.image for r in results},
        "task_s": [r.seconds for r in results],
    }


def child(spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    import prefect_harbor.flows.prewarm  # noqa: F401  (imports are not the run's)

    result = asyncio.run(prewarm(spec))
    result["peak_rss_mb"] = proc_status_mb("VmHWM")
    spec_path.with_suffix(".out.json").write_text(json.dumps(result))


def run_prewarm(scratch: Path, label: str, spec: dict, env: dict[str, str]) -> dict:
    spec_path = scratch / f"{label}.json"
    spec_path.write_text(json.dumps(spec))
    log = scratch / f"{label}.log"
    before = load()
    with log.open("wb") as out:
        returncode = subprocess.call([sys.executable, __file__, "--child", str(spec_path)], env=env, stdout=out, stderr=subprocess.STDOUT)
    if returncode != 0:
        raise RuntimeError(f"prewarm {label} failed ({returncode}); log {log}:\n{log.read_text()[-3000:]}")
    result = json.loads(spec_path.with_suffix(".out.json").read_text())
    result.update(load_before=before, load_after=load())
    return result


# ------------------------------------------------------------------ the invocation


def remove_images(tags: set[str]) -> int:
    """Remove exactly these images (this benchmark's own), in one podman call; the count removed."""
    from prefect_harbor.sandbox.engine import podman_sync

    if tags:
        podman_sync("rmi", *sorted(tags), timeout=None)
    return sum(podman_sync("image", "exists", tag).returncode != 0 for tag in tags)


def main(arguments: argparse.Namespace) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="prewarm-scale-", dir=arguments.scratch))
    token = uuid.uuid4().hex[:8]
    print(f"{arguments.tasks} generated tasks per set, prewarm concurrency {arguments.concurrency}, max_parallel_builds {arguments.parallel_builds}; "
          f"token {token}; load {load()}")  # fmt: skip
    built_tags: set[str] = set()
    env = dict(os.environ)
    try:
        with prefect_server(scratch / "prefect-home", scratch / "server.log") as (api, server_pid):
            env = {**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(scratch / "client-home")}
            cold: dict[int, dict] = {}
            for builds in arguments.parallel_builds:
                tasks_dir = scratch / f"tasks-b{builds}"
                names = make_tasks(tasks_dir, arguments.tasks, f"{token}b{builds}")
                spec = {"tasks_dir": str(tasks_dir), "task_ids": names, "concurrency": arguments.concurrency, "parallel_builds": builds,
                        "trials_dir": str(scratch / "trials")}  # fmt: skip
                cpu = session_cpu(server_pid)
                cold[builds] = result = run_prewarm(scratch, f"cold-b{builds}", spec, env)
                result["server_cpu_s"] = session_cpu(server_pid) - cpu
                built_tags |= {tag for tag in result["images"].values() if tag}
                print(f"  cold, max_parallel_builds={builds}: {result['wall_s']:.1f} s, {result['built']} built, {result['ok']} ok, "
                      f"load {result['load_before']} -> {result['load_after']}", flush=True)  # fmt: skip
            warm = run_prewarm(scratch, "warm", {**spec, "trials_dir": str(scratch / "trials-warm")}, env)
            print(f"  second prewarm of the last set: {warm['wall_s']:.2f} s, {warm['built']} built, load {warm['load_before']} -> {warm['load_after']}")
            changed = names[0]
            (tasks_dir / changed / "tests" / "test.sh").write_text("#!/bin/bash\n# changed\nmkdir -p /logs/verifier && echo 0 > /logs/verifier/reward.txt\n")
            tests_only = run_prewarm(scratch, "tests-only", {**spec, "task_ids": [changed], "trials_dir": str(scratch / "trials-tests")}, env)
        same_tag = tests_only["images"][changed] == cold[arguments.parallel_builds[-1]]["images"][changed]
        print(f"  tests/ changed in {changed}: {tests_only['built']} built, same image tag: {same_tag}, {tests_only['wall_s']:.2f} s")
        serial = cold.get(1)
        print(f"\n{'max_parallel_builds':<22}{'wall s':>9}{'s per task':>12}{'built':>7}{'ok':>5}{'vs one by one':>15}  load before -> after")
        for builds, result in cold.items():
            versus = f"{result['wall_s'] / serial['wall_s']:.3f}" if serial else "-"
            print(f"{builds:<22}{result['wall_s']:>9.1f}{result['wall_s'] / arguments.tasks:>12.2f}{result['built']:>7}{result['ok']:>5}{versus:>15}  "
                  f"{result['load_before']} -> {result['load_after']}")  # fmt: skip
        for result in (*cold.values(), warm, tests_only):
            if result["errors"]:
                print(f"errors: {result['errors']}")
        best = min(cold.values(), key=lambda r: r["wall_s"])
        ratio = best["wall_s"] / serial["wall_s"] if serial else float("nan")
        print(f"second prewarm: {warm['wall_s']:.2f} s for {arguments.tasks} tasks (target < 5 s: {'met' if warm['wall_s'] < 5 else 'missed'}), {warm['built']} built")
        print(f"ratio={ratio:.3f} overhead_ms={warm['wall_s'] / arguments.tasks * 1000:.1f} peak_rss_mb={max(r['peak_rss_mb'] for r in cold.values()):.0f} loop_p99_ms=-")
    finally:
        print(f"removed {remove_images(built_tags)} of the {len(built_tags)} images this benchmark built")
        if arguments.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4, help="the prewarm's n_concurrent (tasks set up at once)")
    parser.add_argument("--parallel-builds", type=lambda text: [int(b) for b in text.split(",")], default=[1, 2, 4], help="max_parallel_builds values, comma-separated; 1 first")
    parser.add_argument("--scratch", type=Path, help="parent folder")
    parser.add_argument("--keep", action="store_true")
    main(parser.parse_args())
