"""The ``certify-tasks`` flow: each task's oracle and Harbor's do-nothing agent, N attempts each,
judged per task and kept by the task's content digest (:mod:`prefect_harbor.certification`).

It is two ordinary sweeps (subflows, their run folders beside every other run), so the attempts
run, are isolated, archived and counted exactly as a sweep's are; what is new is the verdict."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.certification import Attempts, Certification, CertificationStore, judge, table_rows, task_digest
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.configuration import picked, resolve_storage
from prefect_harbor.flows.sweep import evaluation_sweep
from prefect_harbor.storage.results import SweepSummary
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.task_folders import tasks_in

#: The table artifact every certify run updates (one card in the UI, its versions the history).
CERTIFICATION_KEY = "certification"
#: The agents a certification runs: the reference solution, and one that does nothing.
CERTIFYING_AGENTS = ("oracle", "nop")


class CertifyCancelled(RuntimeError):
    """A certifying sweep was cancelled: nothing is certified from half the attempts."""


def tasks_under(tasks_dir: Path, names: list[str] | None) -> dict[str, Path]:
    """The Harbor tasks (folders with a task.toml) under ``tasks_dir``, or the ``names`` among them."""
    if not tasks_dir.is_dir():
        raise ConfigurationError(f"tasks_dir: {tasks_dir} is not a folder; give a folder of Harbor tasks (each with a task.toml).")
    found = tasks_in(tasks_dir)
    unknown = sorted(set(names or ()) - set(found))
    if unknown:
        raise ConfigurationError(f"tasks: no Harbor task {', '.join(unknown)} under {tasks_dir}; name folders that hold a task.toml.")
    chosen = {name: found[name] for name in names} if names else found
    if not chosen:
        raise ConfigurationError(f"tasks_dir: {tasks_dir} holds no Harbor task (a folder with a task.toml); point it at a folder of tasks.")
    return chosen


def dataset_of(tasks: dict[str, Path]) -> bytes:
    """One dataset row per task (dataset mode), in JSONL."""
    return b"".join(json.dumps({"id": name, "metadata": {"harbor_task_id": name}}).encode() + b"\n" for name in tasks)


@flow(name="certify-tasks", retries=0, validate_parameters=False)
async def certify_tasks(
    tasks_dir: str,
    runs: int = 3,
    tasks: list[str] | None = None,
    results: str = "results",
    storage_block: str | None = None,
    storage: ResultsStorage | None = None,
    concurrency: int | None = None,
    reward_key: str = "reward",
) -> list[Certification]:
    """Certify each task before a sweep uses it: its oracle ``runs`` times, Harbor's nop agent ``runs`` times.

    Args:
        tasks_dir: A folder of Harbor tasks (each a folder with a task.toml).
        runs: Attempts per task for each of the two agents.
        tasks: Only these task folders (names under tasks_dir); empty: every task.
        results: The results root, a local path or an fsspec URL (when no storage block); the
            certifications are kept under its certifications/ folder, where sweeps look for them.
        storage_block: The name of a saved Results Storage block, instead of results.
        storage: Or the Results Storage block itself, picked in the run form.
        concurrency: Trials at once (default: the backend's, 4).
        reward_key: The verifier's key that is the reward, for tasks that write no 'reward'
            key (as the Harbor Backend block's reward_key: a key, or mean(a, b) / min(a, b)).

    A task is ``certified`` when every oracle attempt is rewarded in full and no nop attempt is;
    ``trivial`` when doing nothing is rewarded; ``broken`` or ``flaky`` when the oracle is never
    or only sometimes rewarded; ``unsettled`` when an attempt measured nothing.
    """
    logger = get_run_logger()
    if runs < 1:
        raise ConfigurationError(f"runs: {runs} attempts per agent certify nothing; give 1 or more (3 or more to see flakiness).")
    chosen = tasks_under(Path(tasks_dir), tasks)
    storage = await resolve_storage(await picked(ResultsStorage, storage, "storage"), storage_block)
    root, options = (storage.url, storage.storage_options()) if storage else (results, None)
    store = CertificationStore(root, options)
    digests = await asyncio.to_thread(lambda: {name: task_digest(folder) for name, folder in chosen.items()})
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    dataset = await asyncio.to_thread(store.folder.write_bytes, f"datasets/certify-{stamp}.jsonl", dataset_of(chosen))
    logger.info(f"Certifying {len(chosen)} task(s) under {tasks_dir}: {runs} attempt(s) each of {' and '.join(CERTIFYING_AGENTS)}")
    attempts: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    sweeps: list[str] = []
    for agent in CERTIFYING_AGENTS:
        backend = HarborBackend(tasks_dir=Path(tasks_dir), task_mode="dataset", agent=agent, attempts=runs, reward_key=reward_key)
        state = await evaluation_sweep(dataset=dataset, backend=backend, results=results, storage=storage, concurrency=concurrency, return_state=True)
        summary = await state.aresult(raise_on_failure=False)
        if state.is_cancelled() or not isinstance(summary, SweepSummary):
            raise CertifyCancelled(f"the {agent} sweep did not finish ({state.name}: {state.message}); nothing was certified") from (
                summary if isinstance(summary, BaseException) else None
            )
        sweeps.append(summary.run_id)
        run = RunStore.open(f"{root.rstrip('/')}/{summary.run_id}", options)
        for record in await asyncio.to_thread(run.read_results):
            attempts[record.row_id][agent].append(record.model_dump())
    certifications = [
        judge(name, digests[name], Attempts.of(attempts[name]["oracle"]), Attempts.of(attempts[name]["nop"]), sweeps) for name in chosen
    ]
    for certification in certifications:
        await asyncio.to_thread(store.save, certification)
        logger.info(f"Task {certification.task}: {certification.label}")
    report = await asyncio.to_thread(store.write_report, stamp, certifications)
    certified = sum(c.verdict == "certified" for c in certifications)
    await acreate_table_artifact(
        table_rows(certifications), key=CERTIFICATION_KEY, description=f"Certification: {certified} of {len(certifications)} task(s) certified; {report}"
    )
    logger.info(f"{certified} of {len(certifications)} task(s) certified; the table is at {report}")
    return certifications
