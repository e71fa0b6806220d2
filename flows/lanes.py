"""The sweep's lanes: attempts at rows admitted one at a time, each run as an asyncio task of its own.

``n_concurrent`` lanes each pull the next attempt (``rows/attempts.py``: a row's ``attempts``
units of work, one after the other) from the dataset only when free, so a large dataset never
becomes thousands of pending task runs. A lane runs its attempts inside task runs of
``trials``, up to ``rows_per_task_run`` each (Prefect's cost per task run outweighs a quick
trial's), or, on a distributed task runner, submits each attempt as a ``trial`` task run of
its own. Every attempt is still its own asyncio task, so a partial cancel stops one row (all
its attempts) of a batch; whatever happens to an attempt (a result, a cancel, a crash), it
reaches the recorder once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from prefect import Task, get_run_logger
from prefect.context import get_run_context
from prefect.futures import PrefectFuture
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner

from prefect_harbor.blocks.storage import PREFECT_RESULTS_FOLDER, ResultsStorage
from prefect_harbor.flows.cancellation import CancelScope, wait_or_cancel
from prefect_harbor.flows.recorder import Recorder
from prefect_harbor.rows.attempts import RowAttempt
from prefect_harbor.rows.dataset import DatasetRow, RowProblem
from prefect_harbor.spec import BackendSpec
from prefect_harbor.storage.control import RowTracker
from prefect_harbor.storage.results import RowResult
from prefect_harbor.tasks import ArchivedRow, SweepContext, run_trial, run_trials, trial_and_archive
from prefect_harbor.trial.row_trial import base_result, cancelled_result, trial_name_for

Row = DatasetRow | RowProblem

#: The default batch: about this many task runs per lane, and never more than this many rows in one.
TASK_RUNS_PER_LANE = 10
MAX_ROWS_PER_TASK_RUN = 100


def default_rows_per_task_run(rows: int, lanes: int) -> int:
    """One row per task run for small sweeps (each row visible in the UI), batches for big ones."""
    return max(1, min(MAX_ROWS_PER_TASK_RUN, math.ceil(rows / (lanes * TASK_RUNS_PER_LANE))))


@dataclass(frozen=True)
class LanePlan:
    """How the rows map onto Prefect task runs: how many lanes, rows per task run, which runner."""

    lanes: int
    rows_per_task_run: int
    #: A non-default task runner (Dask): each row is submitted as its own task run.
    distributed: bool
    #: Attempts per row (task runs are labelled ``row <id> #<attempt>`` when there are several).
    attempts: int = 1
    row_task: Task = run_trial
    #: The lanes' ``trials`` task, with its result persistence.
    batch_task: Task = run_trials

    @classmethod
    def of(cls, config: BackendSpec, storage: ResultsStorage | None, run_id: str, rows_to_run: int, rows_per_task_run: int | None) -> LanePlan:
        """The plan for this flow run: its task runner, and the results storage when it is a saved block."""
        batch_task, row_task = run_trials, run_trial
        if storage is not None and storage._block_document_id is not None:
            # Prefect's own task results persist to the same storage (a saved block is required).
            # cache_policy=None: with NO_CACHE Prefect computes no key and silently writes nothing.
            # refresh_cache: written, never read back: a resumed run (or a shard started again) must run
            # the rows it cancelled, not take their old results from the same key as Cached.
            persisted = dict(cache_policy=None, persist_result=True, refresh_cache=True, result_storage=storage, result_serializer="json")
            folder = f"{run_id}/{PREFECT_RESULTS_FOLDER}"
            batch_task = run_trials.with_options(**persisted, result_storage_key=f"{folder}/rows-from-{{parameters[first].index}}-{{parameters[first].attempt}}.json")
            row_task = run_trial.with_options(**persisted, result_storage_key=f"{folder}/row-{{parameters[unit].index}}-{{parameters[unit].attempt}}.json")
        return cls(
            lanes=config.limits.n_concurrent,
            rows_per_task_run=rows_per_task_run or default_rows_per_task_run(rows_to_run, config.limits.n_concurrent),
            distributed=not isinstance(get_run_context().task_runner, ThreadPoolTaskRunner),
            attempts=config.limits.attempts,
            row_task=row_task,
            batch_task=batch_task,
        )

    def announce(self, logger: logging.Logger | logging.LoggerAdapter) -> None:
        """Say where rows run, when it is not one inline task run per row."""
        if self.distributed:
            logger.info(f"Rows run on {type(get_run_context().task_runner).__name__}, one task run each; trial directories stay on its workers")
        elif self.rows_per_task_run > 1:
            logger.info(f"Up to {self.rows_per_task_run} rows per task run (rows_per_task_run)")


@dataclass(frozen=True)
class TrialRunner:
    """Runs one row's trial: inline, inside the lane's task run, or as its own task run on the distributed runner."""

    sweep: SweepContext
    plan: LanePlan

    async def __call__(self, unit: RowAttempt, trial_name: str, on_grading: Callable[[], None]) -> ArchivedRow:
        if not self.plan.distributed:
            return await trial_and_archive(unit, trial_name, self.sweep, get_run_logger(), on_grading, quiet_success=self.plan.rows_per_task_run > 1)
        # Not quoted: the annotation would reach the worker unresolved. Pickled once per attempt.
        future = self.plan.row_task.submit(unit, trial_name, self.sweep)
        try:
            (result,) = await rows_of(future)
            return ArchivedRow(result)  # run_trial archived it on the worker
        except asyncio.CancelledError:
            future.wrapped_future.cancel()  # a queued row never starts; a running one ends with its worker task
            raise


class Admission:
    """The next attempt a free lane may run, read from the dataset only then; attempts kept from a resumed run are skipped."""

    def __init__(self, units: Iterator[RowAttempt], kept: frozenset[tuple[int, int]], recorder: Recorder, scope: CancelScope):
        self._units = units
        self._kept = kept  # the kept attempts themselves are in the tally and the store, by (row_index, attempt)
        self._recorder = recorder
        self._scope = scope

    def __call__(self) -> RowAttempt | None:
        """The next attempt to run: None when done or stopping."""
        if self._scope.requested.is_set():
            return None
        for unit in self._units:
            if unit.key in self._kept:
                self._recorder.skip()
                continue
            return unit
        return None

    def never_admitted(self) -> list[RowAttempt]:
        """The attempts left when the sweep stopped (read now), kept ones excepted."""
        return [unit for unit in self._units if unit.key not in self._kept]


@dataclass
class Lanes:
    """``plan.lanes`` lanes running admitted rows until the dataset is done or the sweep stops."""

    plan: LanePlan
    trials: TrialRunner
    admission: Admission
    recorder: Recorder
    #: Each row's live status (the control channel publishes it; cancel requests mark rows in it).
    tracker: RowTracker
    scope: CancelScope
    logger: logging.Logger | logging.LoggerAdapter
    #: (Row id, attempt) -> its asyncio task, while it runs.
    _running: dict[tuple[str, int], asyncio.Task[RowResult]] = field(default_factory=dict, init=False)

    async def run(self) -> None:
        """Run every lane; on a cancellation request, cancel the running rows and let the lanes wind down."""
        lanes = {asyncio.create_task(self._lane()) for _ in range(self.plan.lanes)}
        await wait_or_cancel(lanes, self.scope, cancel=lambda: list(self._running.values()))

    def cancel(self, row_id: str) -> None:
        """Stop a row's running attempts (a partial cancel); they are recorded as cancelled."""
        for (running_id, _), task in list(self._running.items()):
            if running_id == row_id:
                task.cancel()

    async def record_never_started(self) -> None:
        """The attempts no lane admitted before the sweep stopped: recorded as cancelled."""
        await record_cancelled(self.admission.never_admitted(), self.recorder, self.tracker)

    async def _lane(self) -> None:
        """Run attempts one after another until the dataset is done or the sweep stops."""
        while (unit := self.admission()) is not None:
            if self.plan.distributed:
                await self._start_row(unit)
                continue
            label = f"row {unit.label(self.plan.attempts)}" if self.plan.rows_per_task_run == 1 else f"rows from {unit.label(self.plan.attempts)}"
            try:
                state = await self.plan.batch_task(label, unit, self._batch_from(unit), return_state=True)
                await rows_of(state)  # raises what the task run raised, if it did not return its rows' state
            except Exception as error:  # Prefect could not run the task run (its API is away): the rows it held are not lost
                self.logger.exception(f"The task run for {label} failed")
                if self.tracker.attempts.get(unit.row.id, {}).get(unit.attempt) == "queued":
                    self.tracker.set(unit.row.id, "failure", unit.attempt)
                    await asyncio.shield(self.recorder.record(internal_error(unit, error, self.trials.sweep.backend)))

    async def _batch_from(self, first: RowAttempt) -> AsyncIterator[RowResult]:
        """The rows of one task run: ``first``, then attempts admitted one at a time, up to ``rows_per_task_run``, each run to its recorded row."""
        yield await self._start_row(first)
        for _ in range(self.plan.rows_per_task_run - 1):
            if (unit := self.admission()) is None:
                return
            yield await self._start_row(unit)

    async def _start_row(self, unit: RowAttempt) -> RowResult:
        """Run the attempt as its own asyncio task, so a partial cancel request can stop just this row."""
        key = (unit.row.id, unit.attempt)
        self._running[key] = asyncio.create_task(self._one_row(unit))
        try:
            return await self._running[key]
        finally:
            self._running.pop(key, None)

    def _deliberate(self, row: Row) -> bool:
        """Whether stopping this row was asked for: the whole sweep, or the row by a cancel request."""
        return self.scope.requested.is_set() or row.id in self.tracker.cancelled_ids

    async def _one_row(self, unit: RowAttempt) -> RowResult:
        """The attempt's trial to its recorded result row, whatever happens to it."""
        config, run = self.trials.sweep.backend, self.trials.sweep.run
        row, index, attempt = unit.row, unit.index, unit.attempt
        trial_name = trial_name_for(row.id, attempt)
        result: RowResult | ArchivedRow
        try:
            if self._deliberate(row):  # cancelled while queued, or the sweep stopped before the row began
                result = cancelled_result(base_result(row, index, config, attempt), None, None, started=False)
            else:
                self.tracker.set(row.id, "running", attempt)
                result = await self.trials(unit, trial_name, on_grading=lambda: self.tracker.set(row.id, "grading", attempt))
        except asyncio.CancelledError:
            if not self._deliberate(row):
                raise
            asyncio.current_task().uncancel()  # we asked for it: record the row, then finish
            result = cancelled_result(base_result(row, index, config, attempt), run, trial_name, started=True)
        except Exception as error:  # a bug must cost one row, never the sweep
            if self._deliberate(row):
                result = cancelled_result(base_result(row, index, config, attempt), run, trial_name, started=True)
            else:
                self.logger.exception(f"Row {unit.label(self.plan.attempts)} crashed the trial task")
                result = internal_error(unit, error, config)
        self.tracker.set(row.id, (result.result if isinstance(result, ArchivedRow) else result).status, attempt)
        return await asyncio.shield(self.recorder.record(result))


async def record_cancelled(units: list[RowAttempt], recorder: Recorder, tracker: RowTracker) -> None:
    """Attempts that never started, each a ``cancelled`` result row and live status."""
    if units:
        await recorder.record_never_started(units)
        for unit in units:
            tracker.set(unit.row.id, "cancelled", unit.attempt)


def internal_error(unit: RowAttempt, error: Exception, config: BackendSpec) -> RowResult:
    """The result row of an attempt the sweep itself failed (a bug, or Prefect unable to run its task run):
    Harbor's ``harbor_failed``, so the scoring contract leaves it out of the mean rather than blame the agent."""
    return base_result(unit.row, unit.index, config, unit.attempt).model_copy(
        update={"err_category": "agent_error", "err_message": f"internal error: {type(error).__name__}: {error}", "failure_cause": "harbor_failed"}
    )


async def rows_of(ran: State | PrefectFuture) -> list[RowResult]:
    """The rows a trials task run returned in its (Completed, Failed or Cancelled) state, or what it raised."""
    if isinstance(ran, PrefectFuture):
        value = await asyncio.to_thread(ran.result, raise_on_failure=False)
    else:
        value = await ran.aresult(raise_on_failure=False)
    if isinstance(value, BaseException):
        raise value
    return value
