"""What building in the builder's container costs: prewarm's image builds, cold and warm, against a baseline checkout.

    .venv/bin/python benchmarks/builder_cost.py --baseline /path/to/other/checkout [--tasks-dir examples/tasks ...] [--cache-mounts] [--rounds 3]

Builds every task's images in each ``--tasks-dir`` as prewarm does (``prepare_task_image``:
main's, its compose services', its separate verifiers'), all tasks at once under the
environment's build slots (``max_parallel_builds``, 2):

* **cold**: the tasks are copied and every ``FROM`` line is followed by a ``RUN`` step naming a
  token of this invocation, so no layer above the bases is in any cache (bases, bootstrapped
  or stood in once per host, are);
* **warm**: the same copies again, every image already made: what a second sweep's prewarm pays;
* **cache mounts** (``--cache-mounts``): one task whose ``RUN --mount=type=cache`` installs a
  package with apt's caches mounted (downloads held to 10 MB/s by apt's ``Dl-Limit``, as over an
  ordinary link: this host's mirror is near), built, edited (a new layer above the base) and built again
  (``rebuild_s``: its caches warm), against the same edit in another folder (``fresh_s``: a task
  whose caches are cold). ``RUN --mount=type=cache`` speeds a rebuild when rebuild < fresh.

Each side runs in a child process of its checkout's own interpreter (``--baseline``: a checkout
with its ``.venv``, e.g. a worktree of the commit before the builder container; this checkout
otherwise), cold then warm, the sides alternating for ``--rounds`` rounds (the cache-mount walls
in the first). Images a side built are removed by tag afterwards. Ends with the medians' ratios,
``ratio_cold=<this/baseline> ratio_warm=<this/baseline>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_FROM = re.compile(r"^(\s*FROM\s.*)$", re.IGNORECASE | re.MULTILINE)


def busted_copy(tasks_dir: Path, into: Path, token: str) -> list[Path]:
    """The tasks of ``tasks_dir`` copied into ``into``, each Dockerfile's stages made new by ``token``."""
    shutil.copytree(tasks_dir, into)
    for dockerfile in into.rglob("Dockerfile"):
        dockerfile.write_text(_FROM.sub(lambda m: f"{m.group(1)}\nRUN echo {token} > /dev/null", dockerfile.read_text()))
    return sorted(path.parent for path in into.glob("*/task.toml"))


async def prepare_all(tasks: list[Path]) -> tuple[float, list[str]]:
    """Every task's images, all at once (the build slots bound them): the wall, and the images."""
    from prefect_harbor.sandbox import prepare_task_image

    started = time.perf_counter()
    prepared = await asyncio.gather(*(prepare_task_image(task, {}, logging.getLogger("bench")) for task in tasks))
    return time.perf_counter() - started, sorted({image.image for image in prepared})


_CACHED_INSTALL = """FROM debian:bookworm-slim
RUN echo {token} > /dev/null
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \\
    rm -f /etc/apt/apt.conf.d/docker-clean && apt-get -o Acquire::http::Dl-Limit=10000 update -qq \\
    && apt-get -o Acquire::http::Dl-Limit=10000 install -y -qq --no-install-recommends python3 python3-venv > /dev/null
"""


def cache_mount_walls(scratch: Path) -> tuple[dict, list[str]]:
    """A rebuild with warm cache mounts against the same build with cold ones (module docstring)."""
    walls, images = {}, []
    for step, folder in (("first_s", "rebuilt"), ("rebuild_s", "rebuilt"), ("fresh_s", "fresh")):
        task = Path(scratch, folder, "task")
        if not task.exists():
            shutil.copytree(REPO / "examples" / "tasks" / "reward-txt", task)
        (task / "environment" / "Dockerfile").write_text(_CACHED_INSTALL.format(token=secrets.token_hex(6)))
        wall, built = asyncio.run(prepare_all([task]))
        walls[step], images = round(wall, 2), images + built
    return walls, images


def side(tasks_dirs: list[Path], cache_mounts: bool) -> dict:
    """One checkout's cold and warm walls (run in that checkout's interpreter)."""
    token = secrets.token_hex(6)
    with tempfile.TemporaryDirectory(prefix="builder-cost-") as scratch:
        tasks = [task for n, folder in enumerate(tasks_dirs) for task in busted_copy(folder, Path(scratch, str(n)), token)]
        cold, images = asyncio.run(prepare_all(tasks))
        warm, _ = asyncio.run(prepare_all(tasks))
        result = {"cold_s": round(cold, 2), "warm_s": round(warm, 2), "tasks": len(tasks), "images": len(images)}
        if cache_mounts:
            result["cache_mounts"], built = cache_mount_walls(Path(scratch, "cache"))
            images += built
    subprocess.run(["podman", "rmi", "--force", *images], capture_output=True, check=False)
    return result


def run_side(checkout: Path, tasks_dirs: list[Path], cache_mounts: bool) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    flags = [arg for folder in tasks_dirs for arg in ("--tasks-dir", str(folder))] + (["--cache-mounts"] if cache_mounts else [])
    done = subprocess.run(
        [str(python), __file__, "--side", *flags],
        capture_output=True, text=True, cwd=checkout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks-dir", type=Path, action="append", help="Task folders to build (default: examples/tasks).")
    parser.add_argument("--baseline", type=Path, help="A checkout (with its .venv) to compare against.")
    parser.add_argument("--cache-mounts", action="store_true", help="Also measure a rebuild with warm cache mounts.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of both sides, alternating; the ratios are of medians.")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tasks_dirs = [folder.resolve() for folder in args.tasks_dir or [REPO / "examples" / "tasks"]]
    if args.side:
        print(json.dumps(side(tasks_dirs, args.cache_mounts)))
        return
    sides = [(name, checkout.resolve()) for name, checkout in (("baseline", args.baseline), ("this", REPO)) if checkout is not None]
    rounds: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for round_ in range(args.rounds):  # alternating sides, so a busy minute weighs on both
        for name, checkout in sides:
            rounds[name].append(run_side(checkout, tasks_dirs, args.cache_mounts and round_ == 0))
            print(f"round {round_ + 1} {name:8} {checkout}: {rounds[name][-1]}", flush=True)
    medians = {name: {key: statistics.median(r[key] for r in runs) for key in ("cold_s", "warm_s")} for name, runs in rounds.items()}
    for name, median in medians.items():
        print(f"{name:8} median of {args.rounds}: cold {median['cold_s']:.2f} s, warm {median['warm_s']:.2f} s")
    if "baseline" in medians:
        this, baseline = medians["this"], medians["baseline"]
        print(f"ratio_cold={this['cold_s'] / baseline['cold_s']:.2f} ratio_warm={this['warm_s'] / max(baseline['warm_s'], 0.01):.2f}")


if __name__ == "__main__":
    main()
