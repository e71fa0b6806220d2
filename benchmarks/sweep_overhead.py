"""How much the Prefect pipeline costs on top of raw Harbor trials.

Runs, in one process and one minute (the sandbox's own cost is ``container_cost.py``'s):
  1. N rows of the example tasks as raw harbor trials (Trial.create + run, no Prefect);
  2. the same N rows through the evaluation-sweep flow on a running Prefect server;
and prints seconds, per-row milliseconds and the flow/raw ratio. Figures are for
comparison within one run, not absolute claims.

    .venv/bin/python benchmarks/sweep_overhead.py --rows 40 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig  # noqa: E402
from harbor.trial.trial import Trial  # noqa: E402

import prefect_harbor  # noqa: E402,F401  (offline defaults before harbor is imported)
from prefect_harbor.sandbox import IMPORT_PATH  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "examples" / "tasks"
# The quick tasks: background-process sleeps on purpose and would only measure its sleep.
QUICK_TASKS = ["reward-txt", "multi-key-reward", "broken-solution", "no-network"]


async def raw_trials(rows: int, concurrency: int, trials_dir: Path) -> float:
    slots = asyncio.Semaphore(concurrency)

    async def one(n: int, name: str) -> None:
        async with slots:
            trial = await Trial.create(
                TrialConfig(
                    task=TaskConfig(path=TASKS / name),
                    trials_dir=trials_dir, trial_name=f"raw{n}", agent=AgentConfig(name="oracle"),
                    environment=EnvironmentConfig(import_path=IMPORT_PATH),
                )  # fmt: skip
            )
            result = await trial.run()
            assert result.verifier_result is not None, result.exception_info

    began = time.perf_counter()
    await asyncio.gather(*(one(n, name) for n, name in enumerate(row_tasks(rows))))
    return time.perf_counter() - began


def row_tasks(rows: int, task_names: list[str] = QUICK_TASKS) -> list[str]:
    """The task each of ``rows`` dataset rows runs: the names in turn."""
    return [task_names[n % len(task_names)] for n in range(rows)]


def write_dataset(path: Path, rows: int, task_names: list[str] = QUICK_TASKS) -> Path:
    """A dataset-mode JSONL of ``rows`` rows ``r0, r1, ...`` over ``task_names`` in turn."""
    with path.open("w") as out:
        for n, name in enumerate(row_tasks(rows, task_names)):
            out.write(json.dumps({"id": f"r{n}", "metadata": {"harbor_task_id": name}}) + "\n")
    return path


def sweep_backend(concurrency: int, trials_dir: Path, tasks_dir: Path = TASKS):
    """The inline backend the benchmarks sweep with: oracle agent, dataset mode, the local sandbox."""
    from prefect_harbor.blocks import HarborBackend

    return HarborBackend(tasks_dir=tasks_dir, task_mode="dataset", agent="oracle", n_concurrent=concurrency, trials_dir=str(trials_dir))


async def flow_trials(rows: int, concurrency: int, scratch: Path) -> float:
    from prefect_harbor.flows import evaluation_sweep

    dataset = write_dataset(scratch / "bench.jsonl", rows)
    backend = sweep_backend(concurrency, scratch / "trials")
    began = time.perf_counter()
    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(scratch / "results"))
    elapsed = time.perf_counter() - began
    assert summary.rows == rows and summary.failure == 0, summary
    return elapsed


async def main(rows: int, concurrency: int) -> None:
    from prefect.testing.utilities import prefect_test_harness

    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        raw = await raw_trials(rows, concurrency, scratch / "raw")
        began = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=120):
            server_start = time.perf_counter() - began
            flow = await flow_trials(rows, concurrency, scratch)
    print(f"{'path':<34}{'seconds':>9}{'ms/row':>9}")
    print(f"{'raw harbor trials (no Prefect)':<34}{raw:>9.2f}{raw / rows * 1000:>9.0f}")
    print(f"{'evaluation-sweep flow':<34}{flow:>9.2f}{flow / rows * 1000:>9.0f}")
    print(f"flow / raw ratio: {flow / raw:.2f}  ({rows} rows, concurrency {concurrency}; Prefect server start {server_start:.1f} s not included)")
    print(f"peak RSS of this process (raw run, then flow run): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rows, arguments.concurrency))
