"""The per-row Prefect task: one Harbor trial, verified and archived, as one result row."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.results import RowResult
from prefect_harbor.rows import DatasetRow, RowProblem
from prefect_harbor.sources import TaskResolver
from prefect_harbor.tasks.archive import Archiver
from prefect_harbor.trials import RunContext, run_row


@task(name="trial", task_run_name="row {row.id}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def run_trial(
    row: DatasetRow | RowProblem, index: int, trial_name: str, backend: HarborBackend, resolver: TaskResolver, run: RunContext,
    archiver: Archiver, on_grading: Callable[[], None] | None = None,
) -> RowResult:  # fmt: skip
    """Run the row's trial in its sandbox, score it and archive it; never retried (a retry is a new row).

    The flow passes the run-wide arguments wrapped in ``prefect.utilities.annotations.quote``:
    Prefect then does not walk them for upstream futures on every call.
    """
    logger = get_run_logger()
    result = await run_row(row, index, trial_name, backend, resolver, run, logger, on_grading)
    return await asyncio.to_thread(archiver, result, logger)
