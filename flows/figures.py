"""The sweep's closing figures: its statistics, the comparison with its deployment's previous sweep, and the files that keep them.

When the results table is compacted, the run's statistics (``stats/summary.py``: intervals,
pass@k, tokens and cost, overall and per task) are computed from it, and a sweep that a
deployment started (served or on a worker, scheduled or not) is compared with the previous
completed sweep of the same deployment over the same dataset (same fingerprint) under the
same results root (``stats/compare.py``). They land in the flow's summary (its headline and
report), in ``summary.json``, and in the Harbor job files ``harbor view`` reads
(``storage/harbor_job.py``; ``config.json`` and a first ``result.json`` as the run starts).

None of this may cost the sweep its results: they are written by then, so a failure here is
a warning, and the summary goes without what could not be computed.
"""

from __future__ import annotations

import asyncio
import logging

import pyarrow as pa

from prefect_harbor.flows.run_folder import RunFolder
from prefect_harbor.secrets import Redactor
from prefect_harbor.spec import BackendSpec
from prefect_harbor.stats.compare import Comparison, compare_tables
from prefect_harbor.stats.summary import summarize_table
from prefect_harbor.storage.harbor_job import JOB_CONFIG, JOB_RESULT, finished_job, job_config, started_job, to_json
from prefect_harbor.storage.manifest import RunManifest
from prefect_harbor.storage.reading import DamagedFile
from prefect_harbor.storage.results import SweepSummary
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.trial.row_trial import model_for

SUMMARY_FILE = "summary.json"

Logger = logging.Logger | logging.LoggerAdapter


async def open_job(folder: RunFolder, config: BackendSpec, trials: int, redactor: Redactor, logger: Logger) -> None:
    """The run as a Harbor job from its start: ``config.json``, and ``result.json`` with ``trials`` to run."""
    try:
        name = folder.manifest.flow_run_name or folder.run_id
        configuration = to_json(job_config(config, name, results_root(folder.store), model_for(config, None)))
        await asyncio.to_thread(folder.store.write_bytes, JOB_CONFIG, redactor.text(configuration.decode()).encode())
        await asyncio.to_thread(folder.store.write_bytes, JOB_RESULT, to_json(started_job(folder.manifest, trials)))
    except Exception as error:  # the viewer's files are a view of the run, never a reason to stop it
        logger.warning(f"Could not write the run's Harbor job files (harbor view): {type(error).__name__}: {error}")


async def close(folder: RunFolder, table: pa.Table, config: BackendSpec, summary: SweepSummary, logger: Logger) -> SweepSummary:
    """The summary with the run's statistics and comparison, kept in ``summary.json`` and the Harbor job's ``result.json``."""
    store = folder.store
    try:
        statistics = await asyncio.to_thread(summarize_table, table, config.limits.attempts)
    except Exception as error:
        logger.warning(f"Could not compute the run's statistics: {type(error).__name__}: {error}")
        statistics = None
    comparison = None
    try:
        comparison = await compare_with_previous(folder, table, logger)
    except Exception as error:
        logger.warning(f"Could not compare with the previous sweep of this deployment: {type(error).__name__}: {error}")
    summary = summary.model_copy(update={"attempts": config.limits.attempts, "statistics": statistics, "comparison": comparison})
    try:
        await asyncio.to_thread(store.write_bytes, SUMMARY_FILE, summary.model_dump_json(indent=2).encode())
        await asyncio.to_thread(store.write_bytes, JOB_RESULT, to_json(finished_job(folder.manifest, table, config.limits.attempts)))
    except Exception as error:
        logger.warning(f"Could not write {SUMMARY_FILE} or the Harbor job's {JOB_RESULT}: {type(error).__name__}: {error}")
    return summary


async def compare_with_previous(folder: RunFolder, table: pa.Table, logger: Logger) -> Comparison | None:
    """This run against the previous completed sweep of its deployment over the same dataset; None when there is none."""
    manifest = folder.manifest
    if manifest is None or manifest.deployment_id is None:
        return None
    found = await asyncio.to_thread(previous_sweep, folder.store, manifest, folder.storage_options)
    if found is None:
        logger.info("No earlier completed sweep of this deployment over this dataset to compare with")
        return None
    store, previous = found
    baseline = await asyncio.to_thread(store.read_table)
    comparison = compare_tables(baseline, table, store.uri(), folder.store.uri()).of_runs(previous, manifest)
    logger.info(f"Compared with {store.uri()}: {comparison.phrase()}")
    return comparison


def previous_sweep(store: RunStore, manifest: RunManifest, storage_options: dict | None) -> tuple[RunStore, RunManifest] | None:
    """The latest run before this one under its results root that the same deployment started on the same dataset and that completed."""
    fingerprint = manifest.dataset.get("fingerprint")
    earlier = sorted((s for s in RunStore.runs_under(results_root(store), storage_options) if s.run_id < manifest.run_id), key=lambda s: s.run_id, reverse=True)
    for candidate in earlier:  # run ids begin with their UTC start: newest first
        try:
            previous = candidate.read_manifest()
        except (FileNotFoundError, DamagedFile):
            continue
        if previous.deployment_id == manifest.deployment_id and previous.state == "Completed" and previous.dataset.get("fingerprint") == fingerprint:
            return candidate, previous
    return None


def results_root(store: RunStore) -> str:
    """The results root the run folder is in, as a URL."""
    return store.fs.unstrip_protocol(store.run_path.rpartition("/")[0])
