"""The Prefect tasks that run rows: a batch of rows on the flow's event loop, or one row on a worker.

A sweep runs its rows in ``n_concurrent`` lanes; each lane runs its rows inside task runs of
:func:`run_trials`, up to ``limit`` rows each (one row per task run for small sweeps, so the UI
shows every row; more for big ones, because Prefect's cost per task run is several times a
small trial's orchestration: ``docs/performance.md``). With a distributed task runner (Dask)
each row is a task run of :func:`run_trial` on a worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.results import RowResult
from prefect_harbor.rows import DatasetRow, RowProblem
from prefect_harbor.sources import TaskResolver
from prefect_harbor.tasks.archive import Archiver
from prefect_harbor.trials import RunContext, run_row

#: The next row a lane may run, ``(index, row)``, or None when the dataset is done or the sweep stops.
Admit = Callable[[], "tuple[int, DatasetRow | RowProblem] | None"]
#: Runs one admitted row to its result row (trial, verification, archive, bookkeeping).
RunOne = Callable[[int, "DatasetRow | RowProblem"], Awaitable[RowResult]]


async def trial_and_archive(
    row: DatasetRow | RowProblem, index: int, trial_name: str, backend: HarborBackend, resolver: TaskResolver, run: RunContext,
    archiver: Archiver, logger: logging.Logger | logging.LoggerAdapter, on_grading: Callable[[], None] | None = None,
) -> RowResult:  # fmt: skip
    """Run the row's trial in its sandbox, score it and archive it; never retried (a retry is a new row)."""
    result = await run_row(row, index, trial_name, backend, resolver, run, logger, on_grading)
    return await asyncio.to_thread(archiver, result, logger)


@task(name="trials", task_run_name="{label}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def run_trials(label: str, first_index: int, first: DatasetRow | RowProblem, limit: int, admit: Admit, run_one: RunOne) -> list[RowResult]:
    """Run ``first``, then further rows from ``admit``, one after another, up to ``limit`` rows.

    Rows are pulled one at a time, so every lane stays busy until the dataset runs out. The
    flow passes ``admit`` and ``run_one`` wrapped in ``prefect.utilities.annotations.quote``.
    """
    results = [await run_one(first_index, first)]
    while len(results) < limit and (item := admit()) is not None:
        results.append(await run_one(*item))
    get_run_logger().debug(f"{label}: {len(results)} rows, {sum(r.status == 'success' for r in results)} success")
    return results


@task(name="trial", task_run_name="row {row.id}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def run_trial(
    row: DatasetRow | RowProblem, index: int, trial_name: str, backend: HarborBackend, resolver: TaskResolver, run: RunContext,
    archiver: Archiver,
) -> RowResult:  # fmt: skip
    """One row as its own task run, for a distributed task runner: its arguments travel to the worker."""
    return await trial_and_archive(row, index, trial_name, backend, resolver, run, archiver, get_run_logger())
