"""What building in the builder's container costs: prewarm's image builds, cold and warm, against a baseline checkout.

    .venv/bin/python benchmarks/builder_cost.py --baseline /path/to/other/checkout [--tasks-dir examples/tasks ...]

Builds every task's images in each ``--tasks-dir`` as prewarm does (``prepare_task_image``:
main's, its compose services', its separate verifiers'), all tasks at once under the
environment's build slots (``max_parallel_builds``, 2):

* **cold**: the tasks are copied and every ``FROM`` line is followed by a ``RUN`` step naming a
  token of this invocation, so no layer above the bases is in any cache (bases, bootstrapped
  or stood in once per host, are);
* **warm**: the same copies again, every image already made: what a second sweep's prewarm pays.

Each side runs in a child process of its checkout's own interpreter (``--baseline``: a checkout
with its ``.venv``, e.g. a worktree of the commit before the builder container; this checkout
otherwise), cold then warm, baseline first, in the same minute. Images the invocation built are
removed by tag afterwards. Ends with ``ratio_cold=<this/baseline> ratio_warm=<this/baseline>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import secrets
import shutil
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


def side(tasks_dirs: list[Path]) -> dict:
    """One checkout's cold and warm walls (run in that checkout's interpreter)."""
    token = secrets.token_hex(6)
    with tempfile.TemporaryDirectory(prefix="builder-cost-") as scratch:
        tasks = [task for n, folder in enumerate(tasks_dirs) for task in busted_copy(folder, Path(scratch, str(n)), token)]
        cold, images = asyncio.run(prepare_all(tasks))
        warm, _ = asyncio.run(prepare_all(tasks))
    subprocess.run(["podman", "rmi", "--force", *images], capture_output=True, check=False)
    return {"cold_s": round(cold, 2), "warm_s": round(warm, 2), "tasks": len(tasks), "images": len(images)}


def run_side(checkout: Path, tasks_dirs: list[Path]) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), __file__, "--side", *[arg for folder in tasks_dirs for arg in ("--tasks-dir", str(folder))]],
        capture_output=True, text=True, cwd=checkout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks-dir", type=Path, action="append", help="Task folders to build (default: examples/tasks).")
    parser.add_argument("--baseline", type=Path, help="A checkout (with its .venv) to compare against.")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tasks_dirs = [folder.resolve() for folder in args.tasks_dir or [REPO / "examples" / "tasks"]]
    if args.side:
        print(json.dumps(side(tasks_dirs)))
        return
    results = {}
    for name, checkout in (("baseline", args.baseline), ("this", REPO)):
        if checkout is not None:
            results[name] = run_side(checkout.resolve(), tasks_dirs)
            print(f"{name:8} {checkout}: {results[name]}", flush=True)
    if "baseline" in results:
        this, baseline = results["this"], results["baseline"]
        print(f"ratio_cold={this['cold_s'] / baseline['cold_s']:.2f} ratio_warm={this['warm_s'] / max(baseline['warm_s'], 0.01):.2f}")


if __name__ == "__main__":
    main()
