"""The run folder while this sweep owns it: where it is, its manifest's states and its heartbeat.

The folder is the run's lasting record and how other processes tell its state: the manifest
says Running, then Completed, Cancelled or Failed; ``heartbeat.json`` (every few seconds)
tells a live run from a killed one. Opening it also settles where the run writes (a new run,
a resumed one, or a Prefect Retry continuing its own folder) and tidies up after dead runs.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect.context import get_run_context

from prefect_harbor.agents.harness import BundleRuntime
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.flows.cancellation import mark_crashed
from prefect_harbor.flows.selection import prepare_resume
from prefect_harbor.rows.dataset import DatasetInfo
from prefect_harbor.spec import BackendSpec
from prefect_harbor.storage.control import HEARTBEAT_FILE, HEARTBEAT_SECONDS, Heartbeat, find_stale_runs
from prefect_harbor.storage.manifest import RunManifest, now, package_versions
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore, run_folder_of_flow_run, split_run_folder
from prefect_harbor.trial.row_trial import RunContext


def new_run_id() -> str:
    """Sortable and unique: ``20261129T181500Z-1a2b3c4d`` (the flow run's id when there is one)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{current_flow_run_id()[:8]}"


def current_deployment_id() -> str | None:
    """The deployment whose run this is, if a deployment started it (served, a worker's, scheduled or not)."""
    try:
        deployment_id = get_run_context().flow_run.deployment_id
    except Exception:  # called outside a flow run
        return None
    return None if deployment_id is None else str(deployment_id)


def current_flow_run_name() -> str | None:
    """The flow run's name, as the UI shows it; None outside a flow run."""
    try:
        return get_run_context().flow_run.name
    except Exception:  # called outside a flow run
        return None


def current_flow_run_id() -> str:
    try:
        return str(get_run_context().flow_run.id)
    except Exception:  # called outside a flow run
        return uuid.uuid4().hex


class RunFolder:
    """``<root>/<run_id>/`` for this sweep: the store, the manifest it keeps current and the heartbeat."""

    def __init__(
        self, store: RunStore, run: RunContext, storage_options: dict[str, Any] | None, resuming: bool, logger: logging.Logger | logging.LoggerAdapter,
    ) -> None:  # fmt: skip
        self.store = store
        self.storage_options = storage_options
        #: What every row shares: the local trials directory and the prepared runtimes.
        self.run = run
        self.resuming = resuming
        self.logger = logger
        self.manifest: RunManifest | None = None
        #: Rows an earlier attempt recorded (cancelled) that this one runs again: a resumed run's or a Retry's.
        self.superseded: list[str] = []
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @classmethod
    async def open(
        cls, config: BackendSpec, storage: ResultsStorage | None, results: str, resume: str | None, rerun_failed: str | None,
        bundle: BundleRuntime | None, mounts: tuple[dict, ...], logger: logging.Logger | logging.LoggerAdapter,
    ) -> RunFolder:  # fmt: skip
        """A new run folder, or ``resume``'s (a Prefect Retry's own), checked writable; dead runs under its root marked Crashed."""
        results_root = storage.url if storage else results
        options = storage.storage_options() if storage else None
        if resume is None and rerun_failed is None and get_run_context().flow_run.run_count > 1:
            # Prefect's Retry runs the same flow run again: it continues its own run folder.
            resume = await asyncio.to_thread(run_folder_of_flow_run, results_root, current_flow_run_id(), options)
            if resume:
                logger.info(f"This is a retry of flow run {current_flow_run_id()}: resuming its own run folder {resume}")
        root, run_id = split_run_folder(resume) if resume else (results_root, new_run_id())
        folder = await cls._at(config, root, run_id, options, bundle, mounts, logger, resuming=bool(resume))
        try:
            await mark_crashed(await asyncio.to_thread(find_stale_runs, root, options), logger)
        except Exception as error:  # tidying up after dead runs must never stop this one
            logger.warning(f"Could not check {root} for runs whose process died: {type(error).__name__}: {error}")
        return folder

    @classmethod
    async def join(
        cls, config: BackendSpec, storage: ResultsStorage | None, run_folder: str, bundle: BundleRuntime | None, mounts: tuple[dict, ...],
        logger: logging.Logger | logging.LoggerAdapter,
    ) -> RunFolder:  # fmt: skip
        """The folder of a sweep running on many hosts, as one of its shards writes into it: its
        rows' parts and archives only (the sweep's own flow keeps the manifest and heartbeat)."""
        root, run_id = split_run_folder(run_folder)
        return await cls._at(config, root, run_id, storage.storage_options() if storage else None, bundle, mounts, logger, resuming=True)

    @classmethod
    async def _at(
        cls, config: BackendSpec, root: str, run_id: str, options: dict[str, Any] | None, bundle: BundleRuntime | None, mounts: tuple[dict, ...],
        logger: logging.Logger | logging.LoggerAdapter, resuming: bool,
    ) -> RunFolder:  # fmt: skip
        run = RunContext(run_id=run_id, trials_dir=Path(config.trials_dir).expanduser().resolve() / run_id, bundle=bundle, mounts=mounts)
        store = RunStore(root, run_id, fallback_dir=run.trials_dir / "_unsent", storage_options=options, logger=logger)
        await asyncio.to_thread(store.check_writable)
        return cls(store, run, options, resuming=resuming, logger=logger)

    async def begin(self, info: DatasetInfo, configuration: dict, backend_block: str | None, rerun_of: str | None) -> dict[tuple[int, int], RowResult]:
        """Mark the run Running (a resumed run checked and its finished attempts returned, by row index and attempt) and keep its heartbeat."""
        self.manifest = RunManifest(
            run_id=self.run_id, flow_run_id=current_flow_run_id(), flow_run_name=current_flow_run_name(), state="Running", started_at=now(),
            dataset=info.model_dump(), configuration=configuration, backend_block=backend_block, versions=package_versions(), rerun_of=rerun_of,
            deployment_id=current_deployment_id(),
        )  # fmt: skip
        kept: dict[tuple[int, int], RowResult] = {}
        if self.resuming:
            self.manifest, kept, self.superseded = await asyncio.to_thread(prepare_resume, self.store, self.manifest, info.fingerprint)
            again = f"; run again: {', '.join(self.superseded[:20])}{' …' if len(self.superseded) > 20 else ''}" if self.superseded else ""
            self.logger.info(f"Resuming {self.store.uri()}: {len(kept)} finished attempts kept{again}")
        self._heartbeat = await start_heartbeat(self.store, HEARTBEAT_FILE, self.manifest.flow_run_id, self.logger)  # before the manifest says Running
        await asyncio.to_thread(self.store.write_manifest, self.manifest)
        return kept

    async def fail(self, error: BaseException, rows_written: int) -> None:
        """The sweep stopped on an exception: the manifest says Cancelled (a cancelled flow) or Failed."""
        self._heartbeat.cancel()
        self.manifest.state = "Cancelled" if isinstance(error, asyncio.CancelledError) else "Failed"
        self.manifest.finished_at, self.manifest.rows_written = now(), rows_written
        await asyncio.shield(asyncio.to_thread(self.store.write_manifest, self.manifest))

    async def finish(self, state: str, results_uri: str, rows_written: int) -> None:
        """The run's final manifest, then no more heartbeats."""
        self.manifest.state = state
        self.manifest.finished_at, self.manifest.results_uri, self.manifest.rows_written = now(), results_uri, rows_written
        try:
            await asyncio.to_thread(self.store.write_manifest, self.manifest)
        finally:
            self._heartbeat.cancel()



def beat(store: RunStore, file: str, flow_run_id: str) -> None:
    """One heartbeat: ``file`` in the run folder says ``flow_run_id`` is alive now."""
    store.write_now(file, Heartbeat.now(flow_run_id).model_dump_json().encode())


async def start_heartbeat(store: RunStore, file: str, flow_run_id: str, logger: logging.Logger | logging.LoggerAdapter) -> asyncio.Task[None]:
    """The first heartbeat, written before this returns, then one every few seconds until the
    returned task is cancelled: `status`, `cancel`, later sweeps and a sweep watching its shards
    tell a killed process by it going stale."""
    await asyncio.to_thread(beat, store, file, flow_run_id)
    return asyncio.create_task(_keep_heartbeat(store, file, flow_run_id, logger))


async def _keep_heartbeat(store: RunStore, file: str, flow_run_id: str, logger: logging.Logger | logging.LoggerAdapter) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)
        try:
            await asyncio.to_thread(beat, store, file, flow_run_id)
        except Exception as error:  # a missed beat is harmless: a run is taken for dead only after STALE_AFTER_SECONDS
            logger.debug(f"Heartbeat not written: {error}")
