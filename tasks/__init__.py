"""Prefect tasks: the retry-free steps a sweep fans out per dataset row."""

from prefect_harbor.tasks.archive import Archiver
from prefect_harbor.tasks.dataset import inspect_dataset
from prefect_harbor.tasks.trial import lane_task, run_trial, trial_and_archive

__all__ = ["Archiver", "inspect_dataset", "lane_task", "run_trial", "trial_and_archive"]
