"""The ``prewarm`` flow: set up every task a sweep will run, once, before its rows (also a sweep's first step)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact

from prefect_harbor.agents.harness import BundleRuntime
from prefect_harbor.agents.native import prepare_native_agent
from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.flows.bundle import build_bundle_flow
from prefect_harbor.flows.configuration import check_process_budget, resolve_backend
from prefect_harbor.rows.dataset import scan_dataset
from prefect_harbor.spec import BackendSpec
from prefect_harbor.tasks.prewarm import find_prewarmed, prewarm_trial
from prefect_harbor.text import visible_logs, visible_values
from prefect_harbor.trial.prewarm import PrewarmResult, prewarm_targets, remembers_setups, unknown_task
from prefect_harbor.trial.row_trial import RunContext

PREWARM_KEY = "prewarm-report"


async def prewarm_all(config: BackendSpec, run: RunContext, task_ids: list[str] | None) -> list[PrewarmResult]:
    """Prewarm the selected tasks, ``n_concurrent`` at a time, and publish a per-task table.

    Tasks whose setup passed here before, with their images present, are found first in one
    task run and need no other; the rest get a ``prewarm`` task run each."""
    slots = asyncio.Semaphore(config.limits.n_concurrent)

    async def one(target) -> PrewarmResult:
        async with slots:
            return await prewarm_trial(target, config, run)

    targets = prewarm_targets(config, task_ids)
    known = [t for t in targets if not isinstance(t, str)]
    results = [unknown_task(t, config.sources.tasks_dir) for t in targets if isinstance(t, str)]
    for unknown in results:
        get_run_logger().error(f"Prewarm of {unknown.task} failed: {unknown.error}")
    ready = await find_prewarmed(known, config, run) if known and remembers_setups(config) else {}
    results += [ready[t.name] for t in known if t.name in ready]
    results += await asyncio.gather(*(one(t) for t in known if t.name not in ready))
    await acreate_table_artifact(
        visible_values([r.model_dump() for r in results]), key=PREWARM_KEY, description=f"Prewarm: {sum(r.ok for r in results)}/{len(results)} tasks ready"
    )
    return results


@flow(name="prewarm", retries=0, validate_parameters=True)
async def prewarm_flow(
    backend: HarborBackend | None = None, backend_block: str | None = None, dataset: str | None = None, task_ids: list[str] | None = None
) -> list[PrewarmResult]:
    """Build the bundle and set up each task's environment and agent once, install-only.

    Args:
        backend: The backend configuration, inline.
        backend_block: The name of a saved Harbor Backend block, instead of ``backend``.
        dataset: Dataset mode: prewarm the tasks this dataset's rows select.
        task_ids: Dataset mode: prewarm these task ids (in addition to the dataset's).

    Template mode prewarms the template. Returns one result per task; a failed task is
    reported with its reason (the flow itself fails only on a configuration error).
    """
    logger = get_run_logger()
    config = await resolve_backend(backend, backend_block)
    check_process_budget(config)
    bundle: BundleRuntime | None = await build_bundle_flow(backend=config) if config.has_bundle else None
    mounts = tuple(await asyncio.to_thread(prepare_native_agent, config.agent, logger=logger)) if config.is_native else ()
    selected = sorted({*(task_ids or []), *(scan_dataset(dataset).task_ids if dataset else [])})
    run = RunContext(run_id=f"prewarm-{uuid.uuid4().hex[:8]}", trials_dir=Path(config.trials_dir).expanduser().resolve() / "prewarm", bundle=bundle, mounts=mounts)
    with visible_logs():  # the sweep's own prewarm is within sweep_logs
        results = await prewarm_all(config.spec(), run, selected)
    failed = [r.task for r in results if not r.ok]
    reused = sum(r.reused for r in results)
    logger.info(f"Prewarm: {len(results) - len(failed)}/{len(results)} tasks ready ({reused} set up before on this host)" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return results
