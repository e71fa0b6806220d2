"""The Prefect tasks that run rows: a lane's rows on the flow's event loop, or one row on a worker.

A sweep runs its rows in ``n_concurrent`` lanes; each lane runs its rows inside task runs of
:func:`run_trials`, up to ``rows_per_task_run`` rows each (one row per task run for small sweeps, so the UI
shows every row; more for big ones, because Prefect's cost per task run is several times a
small trial's orchestration: ``docs/performance.md``). With a distributed task runner (Dask)
each row is a task run of :func:`run_trial` on a worker.

A task run's state carries its rows' outcome (:func:`outcome_state`), so the UI's task-run
list reads as the rows did: Completed named ``Reward 0.75``, Failed named after the row's
category (``Verifier error``) with its message, Cancelled; a task run of several rows is
named with their counts (``3/4 rewarded, mean 0.75``). Prefect takes a State a task returns
as that task run's final state, and does not fail the flow run for it: the sweep's own
state is its return value. Each row also logs, in its task run, its timings, its archive
and, when it failed or scored zero, the verifier's last lines (:func:`log_row`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterable, Callable
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Completed, Failed, State

from prefect_harbor.outcome import Counts, describe, figure, row_line, state_name
from prefect_harbor.rows.attempts import RowAttempt
from prefect_harbor.secrets import Redactor
from prefect_harbor.storage.results import RowResult
from prefect_harbor.tasks.archive import ArchivedRow, archive_result
from prefect_harbor.tasks.sweep_context import SweepContext
from prefect_harbor.text import visible
from prefect_harbor.trial.outcome import verifier_output
from prefect_harbor.trial.retry import retry_line, retry_wait, set_aside
from prefect_harbor.trial.row_trial import run_row

#: How much of the verifier's output a row's task-run log gets: its last lines, a few KiB at most.
VERIFIER_TAIL_LINES = 30
VERIFIER_TAIL_BYTES = 4096

async def trial_and_archive(
    unit: RowAttempt, trial_name: str, sweep: SweepContext, logger: logging.Logger | logging.LoggerAdapter,
    on_grading: Callable[[], None] | None = None, quiet_success: bool = False,
) -> ArchivedRow:  # fmt: skip
    """Run the attempt's trial in its sandbox, score it, archive it and log it. A try that measured
    nothing for a cause that may pass is tried again (``trial/retry.py``); Prefect never retries it.

    ``quiet_success``: a rewarded row's line at DEBUG (rows batched into one task run, where only the others matter)."""
    limits = sweep.backend.limits
    result = await run_row(unit.row, unit.index, trial_name, sweep.backend, sweep.resolver, sweep.run, logger, on_grading, unit.attempt)
    tries = 1
    while (wait := retry_wait(result, tries, limits)) is not None:
        kept = await asyncio.to_thread(set_aside, result, tries, sweep.run.tasks_copy_dir / trial_name)
        logger.warning(retry_line(result, tries, wait, limits, kept))
        await asyncio.sleep(wait)
        tries += 1
        result = await run_row(unit.row, unit.index, trial_name, sweep.backend, sweep.resolver, sweep.run, logger, on_grading, unit.attempt)
    if tries > 1:
        result = result.model_copy(update={"tries": tries})
    # Read before archiving: a successful row's trial directory is deleted with it.
    tail = await asyncio.to_thread(verifier_tail_of, result, sweep.redactor)
    archived = await asyncio.to_thread(archive_result, result, sweep, logger)
    result = archived.result
    log_row(result, logger, tail, quiet=quiet_success and result.status == "success" and bool(result.reward) and not result.verifier_tampering)
    return archived


def verifier_tail_of(result: RowResult, redactor: Redactor) -> str:
    """The verifier's last lines when the row failed or scored zero (a verifier error's message holds them already)."""
    wanted = result.status == "failure" or (result.status == "success" and not result.reward)
    if not wanted or result.trial_dir is None or result.err_category == "verifier_error":
        return ""
    return verifier_output(Path(result.trial_dir), redactor, lines=VERIFIER_TAIL_LINES, max_bytes=VERIFIER_TAIL_BYTES)


def log_row(result: RowResult, logger: logging.Logger | logging.LoggerAdapter, verifier_tail: str = "", quiet: bool = False) -> None:
    """A row's lines in its task run's log: outcome, timings and archive; then the verifier's last lines, if any."""
    level = logging.DEBUG if quiet else logging.INFO
    logger.log(level, row_line(result))
    if verifier_tail:
        logger.log(level, f"Row {result.row_id}: the verifier's last lines (verifier/test-stdout.txt):\n{verifier_tail}")


def log_outcome(result: RowResult, logger: logging.Logger | logging.LoggerAdapter) -> None:
    """A row's line where no task run of its own says it (rows the flow cancelled or never ran): INFO unless it succeeded cleanly."""
    log_row(result, logger, quiet=result.status == "success" and not result.verifier_tampering)


def outcome_state(results: list[RowResult]) -> State:
    """The task run's state for its rows: the worst outcome decides the type (failure, then cancelled), the name says it."""
    statuses = Counter(result.status for result in results)
    if len(results) == 1:
        name, message = state_name(results[0]), describe(results[0])
    else:
        name = Counts.of(results).name()
        scored = [r.reward for r in results if r.reward is not None]
        mean = f"; mean reward {figure(sum(scored) / len(scored))}" if scored else ""
        message = f"{len(results)} rows: " + ", ".join(f"{statuses[s]} {s}" for s in ("success", "failure", "cancelled") if statuses[s]) + mean
    state = Failed if statuses["failure"] else Cancelled if statuses["cancelled"] else Completed
    return state(name=name, message=visible(message)[:500], data=results)  # the UI and `prefect task-run inspect` show it


@task(name="trials", task_run_name="{label}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def run_trials(label: str, first: RowAttempt, rows: AsyncIterable[RowResult]) -> State:
    """A lane's attempts in one task run: ``rows`` runs ``first`` and those the lane admits after it, each to its recorded result row.

    The lane pulls attempts one at a time, so every lane stays busy until the dataset runs out;
    ``first`` names the task run's persisted result.
    """
    return outcome_state([result async for result in rows])


@task(name="trial", task_run_name="row {unit.row.id}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def run_trial(unit: RowAttempt, trial_name: str, sweep: SweepContext) -> State:
    """One attempt at a row as its own task run, for a distributed task runner: its arguments travel to the worker."""
    return outcome_state([(await trial_and_archive(unit, trial_name, sweep, get_run_logger())).result])
