"""Archiving a row: scrub its trial tree of secrets (fail closed), keep its logs, free the disk.

Runs inside the row's Prefect task (``tasks/trial.py``) right after verification; the flow
also runs it for rows it cancelled. Not a task run of its own: a second task run per row
doubled the Prefect server's work per row (``docs/performance.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prefect_harbor.secrets import Redactor
from prefect_harbor.spec import BackendSpec
from prefect_harbor.storage.archive import ArchiveReport, archive_row
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.trial.row_trial import RunContext, release_trial


@dataclass(frozen=True)
class Archiver:
    """Everything archiving needs that is the same for every row of a run."""

    backend: BackendSpec
    store: RunStore
    run: RunContext
    redactor: Redactor

    def __call__(self, result: RowResult, logger: logging.Logger | logging.LoggerAdapter) -> RowResult:
        """Archive ``result``'s trial (once), redact the row, and release its local directory if configured.

        An archive that fails leaves the row's outcome as it was: the reason goes in ``archive_error``.
        """
        if result.artifact_uri is not None:
            return result
        result = self.redactor.model(result)
        trial_dir = Path(result.trial_dir) if result.trial_dir else None
        try:
            report = archive_row(result, trial_dir, self.store, self.redactor, self.backend.limits.archive)
        except Exception as error:  # storage, disk or a bug: the row's reward is not the archive's to lose
            report = ArchiveReport(uri=None, error=self.redactor.text(f"archiving failed: {type(error).__name__}: {error}"))
        if report.error:
            logger.error(f"Row {result.row_id}: {report.error}")
            result = result.model_copy(update={"trial_dir": result.trial_dir if trial_dir and trial_dir.exists() else None, "archive_error": report.error})
        result = result.model_copy(update={"artifact_uri": report.uri})
        return release_trial(result, self.backend, self.run)
