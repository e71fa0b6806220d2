"""A run's manifest (``manifest.json``): what ran, on what, with which versions, and how it ended."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, Field

VERSIONED_PACKAGES = ("prefect-harbor", "prefect", "harbor", "pyarrow", "fsspec", "s3fs", "pydantic")


class RunManifest(BaseModel):
    run_id: str
    flow_run_id: str | None = None
    flow_run_name: str | None = Field(default=None, description="The Prefect flow run's name, as the UI shows it (null in runs from before it was kept).")
    state: str = Field(description="Running, Completed, Cancelled, Failed or Crashed.")
    started_at: datetime
    finished_at: datetime | None = None
    dataset: dict[str, Any]
    configuration: dict[str, Any] = Field(description="The backend configuration, secrets redacted.")
    backend_block: str | None = Field(default=None, description="The Harbor Backend block the configuration came from, if any.")
    versions: dict[str, str]
    results_uri: str | None = None
    rows_written: int = 0
    local_fallback: str | None = Field(default=None, description="Where files the storage refused are kept.")
    resumed: int = Field(default=0, description="How many times this run was resumed.")
    rerun_of: str | None = Field(default=None, description="The run whose failed and cancelled rows this run re-runs.")
    deployment_id: str | None = Field(default=None, description="The Prefect deployment that started the run, if one did (its runs are compared with each other).")
    unsent_files: list[str] = Field(default_factory=list)


def package_versions() -> dict[str, str]:
    """The installed versions of the packages a run's results depend on (a fresh dict each call)."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    """Read once per process: each lookup parses a package's metadata (~5 ms; a prewarm asks per task)."""
    found = []
    for name in VERSIONED_PACKAGES:
        try:
            found.append((name, version(name)))
        except PackageNotFoundError:
            pass
    return tuple(found)


def now() -> datetime:
    return datetime.now(UTC)
