"""Every result row on its way into the run folder: archived, written, counted and shown once.

A result row reaches the flow from several places: a finished trial (an :class:`ArchivedRow`,
archived in its task run, where its trial directory is), a row the flow cancelled, a row whose
task run Prefect could not run, rows that never started. Each must be redacted and archived
(once: a row that is not an ``ArchivedRow`` yet is archived here), written as a part, counted
in the run's tally and shown in the progress artifact, exactly once. The recorder is that one
path, and it keeps counts only: the flow holds no rows, however large the sweep. Rows that
never started have no trial to archive: they are written as they are, in batches.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from prefect_harbor.flows.reporting import Progress, RowsTable
from prefect_harbor.rows.attempts import RowAttempt
from prefect_harbor.storage.results import RowResult, RunTally, SweepSummary
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.tasks import ArchivedRow, SweepContext, archive_result
from prefect_harbor.tasks.trial import log_outcome
from prefect_harbor.trial.row_trial import base_result, cancelled_result

#: Rows that never started are written this many to a part.
NEVER_STARTED_BATCH = 1000


@dataclass
class Recorder:
    """Archives, writes, tallies and shows the progress of every result row of the run."""

    sweep: SweepContext
    progress: Progress
    #: The row table artifact, published as rows finish.
    rows_table: RowsTable
    #: The run's counts (a resumed run's kept rows included): its summary and report come from them.
    tally: RunTally
    logger: logging.Logger | logging.LoggerAdapter

    async def start(self) -> None:
        """Show the progress artifact (at 0 %)."""
        await self.progress.start()

    def expect(self, total: int) -> None:
        """The run will record ``total`` result rows, not the number it started with (the stopping rule ended it early)."""
        self.progress.total = self.rows_table.total = max(total, 1)

    def skip(self) -> None:
        """A row kept from a resumed run: already written and counted, shown as done."""
        self.progress.skip()

    @property
    def store(self) -> RunStore:
        return self.sweep.store

    async def record(self, row: RowResult | ArchivedRow) -> RowResult:
        """Finish one row: redacted, archived and released unless its task run did that, then written, counted, shown."""
        if not isinstance(row, ArchivedRow):  # rows the flow ended itself: cancelled, crashed, or never given a task run
            logger = self._current_logger()
            row = await asyncio.to_thread(archive_result, row, self.sweep, logger)
            log_outcome(row.result, logger)
        result = row.result
        await asyncio.to_thread(self.store.write_row, result)
        self.tally.add(result)
        await self.progress.advance()
        await self.rows_table.advance()
        return result

    async def record_never_started(self, units: list[RowAttempt]) -> None:
        """Attempts that never reached a sandbox are still result rows: ``cancelled``, in batches."""
        await asyncio.to_thread(self._write_never_started, units)

    def summary(self, run_id: str, results_uri: str) -> SweepSummary:
        """The run's summary from the tally, naming any files the storage refused."""
        store = self.store
        return self.tally.summary(run_id, results_uri, local_fallback=str(store.fallback_dir) if store.unsent else None, unsent_files=store.unsent)

    async def finish(self, summary: SweepSummary) -> None:
        """The progress artifact's final count, the row table's final version."""
        await self.progress.finish(self.tally.rows)
        await self.rows_table.finish(summary)

    def _current_logger(self) -> logging.Logger | logging.LoggerAdapter:
        """The row's task run's logger when the row is recorded inside it (a row cancelled alone), else the flow run's."""
        try:
            return get_run_logger()
        except MissingContextError:
            return self.logger

    def _write_never_started(self, units: Iterable[RowAttempt]) -> None:
        backend = self.sweep.backend
        results = (cancelled_result(base_result(u.row, u.index, backend, u.attempt), None, None, started=False) for u in units)
        for chunk in itertools.batched(results, NEVER_STARTED_BATCH):
            self.store.write_rows(list(chunk))
            for result in chunk:
                self.tally.add(result)
