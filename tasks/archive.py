"""The per-row archiving task: scrub the trial tree, keep its logs, free the disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_harbor.archive import archive_row
from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.results import RowResult
from prefect_harbor.storage import RunStore
from prefect_harbor.trials import RunContext, release_trial


@task(name="archive", task_run_name="archive {result.row_id}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def archive_trial(result: RowResult, backend: HarborBackend, store: RunStore, run: RunContext, secrets: list[str]) -> RowResult:
    """Scrub secrets from the row's trial tree (fail closed), archive it, then clean up."""
    trial_dir = Path(result.trial_dir) if result.trial_dir else None
    report = await asyncio.to_thread(archive_row, result, trial_dir, store, secrets)
    if report.error:
        get_run_logger().error(f"Row {result.row_id}: {report.error}")
        result = result.model_copy(update={"trial_dir": None})
    result = result.model_copy(update={"artifact_uri": report.uri})
    return await asyncio.to_thread(release_trial, result, backend, run)
