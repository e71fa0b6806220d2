"""Prefect tasks: the retry-free steps a sweep fans out per dataset row."""

from prefect_harbor.tasks.archive import ArchivedRow, archive_result
from prefect_harbor.tasks.dataset import inspect_dataset
from prefect_harbor.tasks.sweep_context import SweepContext
from prefect_harbor.tasks.trial import run_trial, run_trials, trial_and_archive

__all__ = ["ArchivedRow", "SweepContext", "archive_result", "inspect_dataset", "run_trial", "run_trials", "trial_and_archive"]
