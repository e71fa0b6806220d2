"""Archiving a row: redact it, scrub its trial tree of secrets (fail closed), keep its logs, free the disk.

Runs inside the row's Prefect task (``tasks/trial.py``) right after verification, where the
trial's directory is; the recorder (``flows/recorder.py``) runs it for the rows the flow ended
itself. Not a task run of its own: a second task run per row doubled the Prefect server's work
per row (``docs/performance.md``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prefect_harbor.storage.archive import ArchiveReport, archive_row
from prefect_harbor.storage.results import RowResult
from prefect_harbor.tasks.sweep_context import SweepContext
from prefect_harbor.trial.row_trial import release_trial


@dataclass(frozen=True)
class ArchivedRow:
    """A result row redacted, archived and its local trial released: only :func:`archive_result` makes one,
    and the recorder archives whatever is not one, so no row is archived (or redacted) twice."""

    result: RowResult


def archive_result(result: RowResult, sweep: SweepContext, logger: logging.Logger | logging.LoggerAdapter) -> ArchivedRow:
    """Redact ``result``, archive its trial, and release its local directory if configured.

    An archive that fails leaves the row's outcome as it was: the reason goes in ``archive_error``.
    """
    result = sweep.redactor.model(result)
    trial_dir = Path(result.trial_dir) if result.trial_dir else None
    try:
        report = archive_row(result, trial_dir, sweep.store, sweep.redactor, sweep.backend.limits.archive)
    except Exception as error:  # storage, disk or a bug: the row's reward is not the archive's to lose
        report = ArchiveReport(uri=None, error=sweep.redactor.text(f"archiving failed: {type(error).__name__}: {error}"))
    if report.error:
        logger.error(f"Row {result.row_id}: {report.error}")
        result = result.model_copy(update={"trial_dir": result.trial_dir if trial_dir and trial_dir.exists() else None, "archive_error": report.error})
    result = result.model_copy(update={"artifact_uri": report.uri})
    return ArchivedRow(release_trial(result, sweep.backend, sweep.run))
