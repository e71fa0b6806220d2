"""Fidelity: do tasks written the way others write them score 1.0 with the oracle agent?

Sweeps the corpus in ``benchmarks/fidelity/`` (one row per task, dataset mode, the oracle
agent, the local container sandbox) through the ``evaluation-sweep`` flow, the product's own
path, and prints one line per task that did not score 1.0 with why (status, category and
message from the results table), then, last, ``fidelity: N/M scored 1.0``. Tasks the corpus
marks ``needs_internet`` are swept and reported but counted apart: this machine has no
internet beyond Debian's mirror and PyPI.

A task that writes no ``reward`` key names its ``reward_key`` in ``corpus.toml``; tasks are
swept in one flow run per reward key (the key is a sweep-wide setting, as for real users).

    .venv/bin/python benchmarks/fidelity.py                   # the whole corpus
    .venv/bin/python benchmarks/fidelity.py --only word-frequency compose-env-report

Uses the server in ``PREFECT_API_URL`` when set, else a temporary one for this run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

CORPUS = Path(__file__).resolve().parent / "fidelity"
MANIFEST = "corpus.toml"
DEFAULT_REWARD_KEY = "reward"


@dataclass(frozen=True)
class CorpusTask:
    """One task of the corpus and what ``corpus.toml`` says about it."""

    name: str
    kinds: tuple[str, ...]
    needs_internet: bool = False
    reward_key: str = DEFAULT_REWARD_KEY
    waits_for: str | None = None


@dataclass
class Outcome:
    """A task's row in the results table, reduced to what the report needs."""

    task: CorpusTask
    status: str
    reward: float | None
    rewards: dict[str, float] = field(default_factory=dict)
    category: str | None = None
    message: str | None = None
    seconds: float | None = None
    archive: str | None = None

    @property
    def scored_one(self) -> bool:
        return self.status == "success" and self.reward == 1.0

    def why(self) -> str:
        """Why it did not score 1.0, in one line."""
        if self.status == "success":
            keys = ", ".join(f"{key}={value:g}" for key, value in sorted(self.rewards.items()))
            reason = f"success, scored {self.reward:g} ({keys})"
        else:
            first = (self.message or "").strip().splitlines()
            reason = f"{self.status} [{self.category or '-'}] {first[0][:400] if first else ''}".rstrip()
        extra = f"; waits for {self.task.waits_for}" if self.task.waits_for else ""
        return f"{reason}{extra}" + (f" (archive: {self.archive})" if self.archive else "")


def load_corpus(root: Path = CORPUS) -> list[CorpusTask]:
    """The tasks ``corpus.toml`` lists, in its order."""
    entries = tomllib.loads((root / MANIFEST).read_text())["tasks"]
    return [
        CorpusTask(
            name=name, kinds=tuple(entry.get("kinds", ())), needs_internet=bool(entry.get("needs_internet", False)),
            reward_key=entry.get("reward_key", DEFAULT_REWARD_KEY), waits_for=entry.get("waits_for"),
        )  # fmt: skip
        for name, entry in entries.items()
    ]


def by_reward_key(tasks: list[CorpusTask]) -> dict[str, list[CorpusTask]]:
    """One sweep per reward key, the default first."""
    groups: dict[str, list[CorpusTask]] = {}
    for task in sorted(tasks, key=lambda t: t.reward_key != DEFAULT_REWARD_KEY):
        groups.setdefault(task.reward_key, []).append(task)
    return groups


def write_dataset(path: Path, tasks: list[CorpusTask]) -> Path:
    """Dataset-mode rows: the row id is the task's folder name."""
    path.write_text("".join(json.dumps({"id": t.name, "metadata": {"harbor_task_id": t.name}}) + "\n" for t in tasks))
    return path


async def sweep(tasks: list[CorpusTask], reward_key: str, scratch: Path, results: str, concurrency: int) -> list[Outcome]:
    """One flow run of ``tasks`` with the oracle agent; their rows read back from results.parquet."""
    import pyarrow.parquet as pq

    from prefect_harbor.blocks import HarborBackend
    from prefect_harbor.flows import evaluation_sweep

    label = "default" if reward_key == DEFAULT_REWARD_KEY else "".join(c if c.isalnum() else "-" for c in reward_key)
    dataset = write_dataset(scratch / f"fidelity-{label}.jsonl", tasks)
    backend = HarborBackend(
        tasks_dir=CORPUS, task_mode="dataset", agent="oracle", reward_key=reward_key,
        n_concurrent=concurrency, trials_dir=str(scratch / "trials"),
    )  # fmt: skip
    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=results)
    print(summary.headline(), flush=True)
    table = pq.read_table(summary.results_uri.removeprefix("file://")).to_pylist()
    named = {task.name: task for task in tasks}
    return [
        Outcome(
            task=named[row["row_id"]], status=row["status"], reward=row["reward"], rewards=dict(row["rewards"] or {}),
            category=row["err_category"], message=row["err_message"], seconds=row["total_sec"], archive=row["artifact_uri"],
        )  # fmt: skip
        for row in table
    ]


def report(outcomes: list[Outcome]) -> list[str]:
    """The lines to print: every task short of 1.0 with why, the internet-bound apart, the fidelity line last."""
    counted = [o for o in outcomes if not o.task.needs_internet]
    apart = [o for o in outcomes if o.task.needs_internet]
    lines = [f"{o.task.name}: {o.why()}" for o in counted if not o.scored_one]
    if apart:
        lines.append(f"needs the internet, counted apart ({sum(o.scored_one for o in apart)}/{len(apart)} scored 1.0):")
        lines += [f"  {o.task.name}: {'scored 1.0' if o.scored_one else o.why()}" for o in apart]
    lines.append(f"fidelity: {sum(o.scored_one for o in counted)}/{len(counted)} scored 1.0")
    return lines


@contextlib.contextmanager
def prefect_api() -> Iterator[None]:
    """The configured Prefect server, or a temporary one for this run."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


async def run(tasks: list[CorpusTask], results: str, concurrency: int) -> list[Outcome]:
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="fidelity-") as scratch:
        for reward_key, group in by_reward_key(tasks).items():
            outcomes += await sweep(group, reward_key, Path(scratch), results, concurrency)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="TASK", help="Sweep only these tasks of the corpus.")
    parser.add_argument("--concurrency", type=int, default=2, help="Trials at once (default 2: this machine has 2 cores).")
    parser.add_argument("--results", default="results/fidelity", help="The results root (default results/fidelity).")
    arguments = parser.parse_args(argv)
    tasks = load_corpus()
    if arguments.only:
        unknown = sorted(set(arguments.only) - {t.name for t in tasks})
        if unknown:
            parser.error(f"not in {CORPUS / MANIFEST}: {', '.join(unknown)}")
        tasks = [t for t in tasks if t.name in arguments.only]
    began = time.perf_counter()
    with prefect_api():
        outcomes = asyncio.run(run(tasks, str(Path(arguments.results).resolve()), arguments.concurrency))
    print(f"{len(outcomes)} tasks swept in {time.perf_counter() - began:.0f} s (concurrency {arguments.concurrency})")
    print("\n".join(report(outcomes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
