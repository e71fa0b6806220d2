"""Which rows a sweep runs: the dataset's first pass, an earlier run's failures, a resumed run's kept rows.

A sweep reads its dataset twice: once before anything runs (count, fingerprint, ids, the
tasks to prewarm), then row by row as lanes free up. ``rerun_failed`` narrows both passes to
an earlier run's failed and cancelled rows under new ids; ``resume`` keeps a run's finished
rows, once its dataset and configuration are known to be the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prefect_harbor.config import ConfigurationError
from prefect_harbor.storage.results import RowResult
from prefect_harbor.rows.dataset import DatasetInfo, DatasetRow, RowProblem, iter_rows
from prefect_harbor.storage.manifest import RunManifest
from prefect_harbor.storage.reading import DamagedFile
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.tasks import inspect_dataset

#: Backend fields that change capacity or local paths, not what a row computes.
RESUMABLE_DIFFERENCES = frozenset({"n_concurrent", "max_queue_depth", "trials_dir"})


@dataclass(frozen=True)
class Selection:
    """The dataset's rows this run is about: what the first pass learned, and the rerun's new ids."""

    dataset: str
    info: DatasetInfo
    #: Original id -> new id, when the run re-runs an earlier run's failures.
    reruns: dict[str, str] | None = None

    @classmethod
    async def inspect(
        cls, dataset: str, rerun_failed: str | None, storage_options: dict[str, Any] | None, logger: logging.Logger | logging.LoggerAdapter,
    ) -> Selection:  # fmt: skip
        """The first pass over the dataset (the ``inspect-dataset`` task), narrowed to ``rerun_failed``'s rows."""
        info = await asyncio.to_thread(inspect_dataset, dataset)
        if not rerun_failed:
            return cls(dataset, info)
        previous = RunStore.open(rerun_failed, storage_options)
        reruns = await asyncio.to_thread(rerun_ids, previous, info.ids)
        info = info.model_copy(update={"ids": list(reruns.values()), "rows": len(reruns)})
        logger.info(f"Re-running {len(reruns)} failed or cancelled rows of {previous.uri()}")
        return cls(dataset, info, reruns)

    def rows(self) -> Iterator[tuple[int, DatasetRow | RowProblem]]:
        """The second pass, streamed: ``(index, row)`` for every row of this run, in dataset order."""
        rows = iter_rows(self.dataset)
        return enumerate(rows if self.reruns is None else rerun_rows(rows, self.reruns))


def prepare_resume(store: RunStore, manifest: RunManifest, fingerprint: str) -> tuple[RunManifest, dict[int, RowResult], list[str]]:
    """Check that the run can be continued; keep its finished rows, drop the rest: the resumed
    manifest, the kept rows by index, and the ids of the recorded rows that will run again
    (cancelled ones: their earlier task runs are superseded).

    A damaged manifest (cut short by a crash) cannot be compared with: the run carries on with
    this run's manifest, saying so, rather than losing the rows its parts hold."""
    try:
        previous = store.read_manifest()
    except FileNotFoundError:
        raise ConfigurationError(f"resume: {store.uri()} has no manifest.json; give the folder of an earlier run.") from None
    except DamagedFile as error:
        store.logger.warning(
            f"resume: {error}. The dataset and the backend configuration could NOT be compared with that run's; "
            "carrying on with this run's. If either changed, its kept rows do not belong to this run: start a new sweep instead."
        )
        previous = manifest
    if previous.state == "Completed":
        raise ConfigurationError(f"resume: {store.uri()} already completed; start a new sweep instead.")
    if previous.dataset.get("fingerprint") != fingerprint:
        raise ConfigurationError(f"resume: the dataset changed since run {previous.run_id} (its rows differ); resume with the same dataset or start a new sweep.")
    changed = sorted(
        key for key in {*previous.configuration, *manifest.configuration} - RESUMABLE_DIFFERENCES
        if previous.configuration.get(key) != manifest.configuration.get(key)
    )  # fmt: skip
    if changed:
        raise ConfigurationError(f"resume: the backend configuration changed since run {previous.run_id} ({', '.join(changed)}); use the same configuration or start a new sweep.")
    recorded = store.read_results()
    kept = {r.row_index: r for r in recorded if r.status in ("success", "failure")}
    superseded = [r.row_id for r in sorted(recorded, key=lambda r: r.row_index) if r.row_index not in kept]
    store.restart_from(list(kept.values()))
    resumed = previous.model_copy(update={"state": "Running", "flow_run_id": manifest.flow_run_id, "finished_at": None, "resumed": previous.resumed + 1})
    return resumed, kept, superseded


def rerun_ids(previous: RunStore, dataset_ids: list[str]) -> dict[str, str]:
    """Original id -> new id for the previous run's failed and cancelled rows, in dataset order."""
    failed = {r.row_id for r in previous.read_results() if r.status in ("failure", "cancelled")}
    if not failed:
        raise ConfigurationError(f"rerun_failed: {previous.uri()} has no failed or cancelled rows (or no results).")
    return {row_id: f"{row_id}~rerun" for row_id in dataset_ids if row_id in failed}


def rerun_rows(rows: Iterable[DatasetRow | RowProblem], reruns: dict[str, str]) -> Iterator[DatasetRow | RowProblem]:
    """Only the rows to re-run, under their new ids; the original id stays in their metadata."""
    for row in rows:
        if row.id in reruns:
            update: dict[str, Any] = {"id": reruns[row.id]}
            if isinstance(row, DatasetRow):
                update["metadata"] = {**row.metadata, "original_row_id": row.id}
            yield row.model_copy(update=update)
