"""The Prefect tasks that run rows: a lane's rows on the flow's event loop, or one row on a worker.

A sweep runs its rows in ``n_concurrent`` lanes; each lane runs its rows inside task runs of
:func:`lane_task`, up to ``limit`` rows each (one row per task run for small sweeps, so the UI
shows every row; more for big ones, because Prefect's cost per task run is several times a
small trial's orchestration: ``docs/performance.md``). With a distributed task runner (Dask)
each row is a task run of :func:`run_trial` on a worker.

A task run's state carries its rows' outcome (:func:`outcome_state`), so the UI's task-run
list reads as the rows did: Completed with ``reward 0.75``, Failed with the row's category
and message, Cancelled. Prefect takes a State a task returns as that task run's final
state, and does not fail the flow run for it: the sweep's own state is its return value.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Completed, Failed, State

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.storage.results import RowResult
from prefect_harbor.rows.dataset import DatasetRow, RowProblem
from prefect_harbor.rows.sources import TaskResolver
from prefect_harbor.tasks.archive import Archiver
from prefect_harbor.trial.row_trial import RunContext, run_row

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


def describe(result: RowResult) -> str:
    """A row's outcome in one line: ``reward 0.75``, or its category and message; then its archive."""
    reward = "no reward" if result.reward is None else f"reward {result.reward:g}"
    line = reward if result.status == "success" else f"{result.err_category or result.status}: {result.err_message}"
    if result.verifier_tampering and result.err_category != "verifier_tampering" and "verifier tampering: " not in (result.err_message or ""):
        line += "; verifier tampering: " + "; ".join(result.verifier_tampering)
    if result.status != "success" or result.archive_error:
        line += f"; archive {result.artifact_uri or '-'}" + (f" ({result.archive_error})" if result.archive_error else "")
    return line


def log_outcome(result: RowResult, logger: logging.Logger | logging.LoggerAdapter) -> None:
    """A row's line where no task run state of its own says it: INFO unless it succeeded."""
    line = f"Row {result.row_id} ({result.task or 'no task'}): {result.status}; {describe(result)}"
    (logger.debug if result.status == "success" and not result.verifier_tampering else logger.info)(line)


def outcome_state(results: list[RowResult]) -> State:
    """The task run's state for its rows: the worst outcome decides (failure, then cancelled)."""
    statuses = Counter(result.status for result in results)
    if len(results) == 1:
        message = describe(results[0])  # Prefect logs it with the final state: the row's one log line
    else:
        scored = [r.reward for r in results if r.reward is not None]
        mean = f"; mean reward {sum(scored) / len(scored):.3g}" if scored else ""
        message = f"{len(results)} rows: " + ", ".join(f"{statuses[s]} {s}" for s in ("success", "failure", "cancelled") if statuses[s]) + mean
    state = Failed if statuses["failure"] else Cancelled if statuses["cancelled"] else Completed
    return state(message=message[:500], data=results)


def lane_task(admit: Admit, run_one: RunOne, **options: Any) -> Task:
    """The task a lane runs its rows in. ``admit`` and ``run_one`` belong to the flow run: bound
    here rather than passed, so the UI lists only the rows' own inputs."""

    @task(name="trials", task_run_name="{label}", retries=0, cache_policy=NO_CACHE, persist_result=False)
    async def run_trials(label: str, first_index: int, first: DatasetRow | RowProblem, limit: int) -> State:
        """Run ``first``, then further rows from ``admit``, one after another, up to ``limit`` rows.

        Rows are pulled one at a time, so every lane stays busy until the dataset runs out.
        """
        results = [await run_one(first_index, first)]
        while len(results) < limit and (item := admit()) is not None:
            results.append(await run_one(*item))
        if len(results) > 1:  # the state can only count them: each row gets its own line
            for result in results:
                log_outcome(result, get_run_logger())
        return outcome_state(results)

    return run_trials.with_options(**options) if options else run_trials


@task(name="trial", task_run_name="row {row.id}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def run_trial(
    row: DatasetRow | RowProblem, index: int, trial_name: str, backend: HarborBackend, resolver: TaskResolver, run: RunContext,
    archiver: Archiver,
) -> State:  # fmt: skip
    """One row as its own task run, for a distributed task runner: its arguments travel to the worker."""
    return outcome_state([await trial_and_archive(row, index, trial_name, backend, resolver, run, archiver, get_run_logger())])
