"""The ``evaluation-sweep`` flow: a dataset fanned out into one Harbor trial per row."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import uuid
from datetime import UTC, datetime
from pathlib import Path

from harbor.utils.env import redact_sensitive_value
from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.futures import PrefectFuture
from prefect.states import Cancelled, Completed, State
from prefect.task_runners import ThreadPoolTaskRunner

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.control import (
    CONTROL_FOLDER, HEARTBEAT_FILE, HEARTBEAT_SECONDS, STATUS_FILE, CancelRequest, Heartbeat, RowTracker, find_stale_runs,
)  # fmt: skip
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.bundle import build_bundle_flow
from prefect_harbor.flows.configuration import harbor_logs_in_trial_logs_only, install_log_filters, resolve_backend, resolve_storage
from prefect_harbor.flows.prewarm import prewarm_all
from prefect_harbor.prewarm import PrewarmResult
from prefect_harbor.flows.cancellation import CancelScope, mark_crashed, wait_or_cancel
from prefect_harbor.flows.reporting import Progress, publish, run_tags, sweep_run_name, tag_flow_run
from prefect_harbor.results import RowResult, RunTally, SweepSummary
from prefect_harbor.rows import DatasetRow, RowProblem, iter_rows, path_safe
from prefect_harbor.native_agents import prepare_native_agent
from prefect_harbor.sandbox.janitor import reap_orphans
from prefect_harbor.sources import TaskResolver
from prefect_harbor.secrets import Redactor, redacting_logs, secret_values
from prefect_harbor.storage import DamagedFile, RunManifest, RunStore, now, package_versions, run_folder_of_flow_run, split_run_folder
from prefect_harbor.tasks import Archiver, inspect_dataset, lane_task, run_trial, trial_and_archive
from prefect_harbor.tasks.trial import log_outcome
from prefect_harbor.trials import RunContext, base_result, cancelled_result, trial_name_for


CONTROL_POLL_SECONDS = 1.0
install_log_filters()


def new_run_id() -> str:
    """Sortable and unique: ``20261129T181500Z-1a2b3c4d`` (the flow run's id when there is one)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{current_flow_run_id()[:8]}"


def current_flow_run_id() -> str:
    try:
        return str(get_run_context().flow_run.id)
    except Exception:  # called outside a flow run
        return uuid.uuid4().hex


@flow(name="evaluation-sweep", flow_run_name=sweep_run_name, retries=0, validate_parameters=True)
async def evaluation_sweep(
    dataset: str,
    backend: HarborBackend | None = None,
    backend_block: str | None = None,
    results: str = "results",
    storage_block: str | None = None,
    storage: ResultsStorage | None = None,
    concurrency: int | None = None,
    resume: str | None = None,
    rerun_failed: str | None = None,
    prewarm: bool = True,
    rows_per_task_run: int | None = None,
) -> SweepSummary:
    """Run every row of ``dataset`` as a Harbor trial and write the results table.

    Args:
        dataset: JSONL or Parquet rows, a path or an fsspec URL.
        backend: A Harbor Backend block, picked in the run form (or inline, in code).
        backend_block: Or the name of a saved Harbor Backend block (the command line's way).
        results: The results root, a local path or an fsspec URL (when no storage block).
        storage_block: The name of a saved Results Storage block, instead of results (the command line's way).
        storage: Or the Results Storage block itself, picked in the run form (or inline, in code).
        concurrency: Overrides the backend's n_concurrent for this run.
        resume: The folder of a crashed or cancelled run of the same dataset and backend to
            continue: its finished rows are kept, the others run.
        rerun_failed: The folder of an earlier run: a new run of only its failed and
            cancelled rows, with new row ids (<id>~rerun) that point to the originals.
        prewarm: First set up each selected task once (install-only, no credentials); the
            rows of a task that fails it fail at once with its reason.
        rows_per_task_run: How many rows one Prefect task run may hold. Empty: one per row
            up to 40 rows at 4 at a time, then more (about ten task runs per lane, at most
            100 rows each), because Prefect's cost per task run outweighs a quick trial's.

    Rows run in ``n_concurrent`` lanes; a lane reads the next row from the dataset only
    when it is free, so a large dataset never becomes thousands of pending task runs.
    Every row yields exactly one result row, whatever happens to it.
    """
    logger = get_run_logger()
    if get_run_context().flow.retries:
        raise ConfigurationError(
            "retries: a sweep is retry-free (a retry is a new row id): drop retries from evaluation_sweep.with_options(...), "
            "and re-run failures explicitly with rerun_failed / --rerun-failed."
        )
    if rows_per_task_run is not None and rows_per_task_run < 1:
        raise ConfigurationError(f"rows_per_task_run: {rows_per_task_run} is not a row count; give 1 or more, or leave it empty for the default.")
    block_name = backend_block or getattr(backend, "_block_document_name", None)
    config = await resolve_backend(backend, backend_block)
    tags = run_tags(config, block_name)
    logger.info(f"Backend {'block ' + repr(block_name) if block_name else '(inline)'}: " + ", ".join(tags))
    try:
        await tag_flow_run(current_flow_run_id(), tags)
    except Exception as error:  # outside a server-backed run (or an old server): names only
        logger.debug(f"Could not tag the flow run: {error}")
    if config.environment.is_local_sandbox:
        for reaped in await asyncio.to_thread(reap_orphans):
            logger.warning(f"Removed container {reaped}, left behind by a run whose process died.")
    if concurrency is not None:
        config = config.model_copy(update={"n_concurrent": concurrency})
    storage = await resolve_storage(storage, storage_block)
    # Before anything is written: a project that cannot be bundled is a configuration error.
    bundle = await build_bundle_flow(backend=config) if config.has_bundle else None
    mounts = tuple(await asyncio.to_thread(prepare_native_agent, config.agent, logger=logger)) if config.is_native else ()
    redactor = Redactor.of(run_secrets(config, storage))
    with redacting_logs(redactor), harbor_logs_in_trial_logs_only():
        return await _sweep(dataset, config, block_name, storage, redactor, bundle, mounts, results, resume, rerun_failed, prewarm, rows_per_task_run)


async def _sweep(
    dataset: str, config: HarborBackend, block_name: str | None, storage: ResultsStorage | None, redactor: Redactor, bundle, mounts: tuple, results: str,
    resume: str | None, rerun_failed: str | None, prewarm: bool, rows_per_task_run: int | None,
) -> SweepSummary:  # fmt: skip
    """The sweep once its configuration is known: every log record it makes is redacted."""
    logger = get_run_logger()
    results_root = storage.url if storage else results
    options = storage.storage_options() if storage else None
    if resume is None and rerun_failed is None and get_run_context().flow_run.run_count > 1:
        # Prefect's Retry runs the same flow run again: it continues its own run folder.
        resume = await asyncio.to_thread(run_folder_of_flow_run, results_root, current_flow_run_id(), options)
        if resume:
            logger.info(f"This is a retry of flow run {current_flow_run_id()}: resuming its own run folder {resume}")
    root, run_id = split_run_folder(resume) if resume else (results_root, new_run_id())
    run = RunContext(run_id=run_id, trials_dir=Path(config.trials_dir).expanduser().resolve() / run_id, bundle=bundle, mounts=mounts)
    store = RunStore(
        root, run_id, fallback_dir=run.trials_dir / "_unsent", storage_options=options, logger=logger,
    )  # fmt: skip
    await asyncio.to_thread(store.check_writable)
    try:
        await mark_crashed(await asyncio.to_thread(find_stale_runs, root, options), logger)
    except Exception as error:  # tidying up after dead runs must never stop this one
        logger.warning(f"Could not check {root} for runs whose process died: {type(error).__name__}: {error}")
    info = await asyncio.to_thread(inspect_dataset, dataset)
    reruns: dict[str, str] | None = None
    if rerun_failed:
        previous = RunStore.open(rerun_failed, options)
        reruns = await asyncio.to_thread(rerun_ids, previous, info.ids)
        info = info.model_copy(update={"ids": list(reruns.values()), "rows": len(reruns)})
        logger.info(f"Re-running {len(reruns)} failed or cancelled rows of {previous.uri()}")
    configuration = redactor.configuration(config.model_dump(mode="json"))
    manifest = RunManifest(
        run_id=run_id, flow_run_id=current_flow_run_id(), state="Running", started_at=now(),
        dataset=info.model_dump(), configuration=configuration, backend_block=block_name, versions=package_versions(), rerun_of=rerun_failed,
    )  # fmt: skip
    kept: dict[int, RowResult] = {}
    if resume:
        manifest, kept = await asyncio.to_thread(prepare_resume, store, manifest, info.fingerprint)
        logger.info(f"Resuming {store.uri()}: {len(kept)} finished rows kept, {info.rows - len(kept)} to run")

    def beat() -> None:
        store.write_now(HEARTBEAT_FILE, Heartbeat.now(manifest.flow_run_id).model_dump_json().encode())

    async def keep_heartbeat() -> None:
        """Say every few seconds that this run is alive: `status`, `cancel` and later sweeps tell a killed run by it."""
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await asyncio.to_thread(beat)
            except Exception as error:  # a missed beat is harmless: a run is taken for dead only after STALE_AFTER_SECONDS
                logger.debug(f"Heartbeat not written: {error}")

    await asyncio.to_thread(beat)  # before the manifest says Running
    heartbeat = asyncio.create_task(keep_heartbeat())
    await asyncio.to_thread(store.write_manifest, manifest)
    if prewarm:
        prewarmed = await prewarm_all(config, run, info.task_ids)
        await asyncio.to_thread(archive_build_logs, store, prewarmed, redactor)
        run = dataclasses.replace(run, prewarm_failures={r.task: r.error or "prewarm failed" for r in prewarmed if not r.ok})
    batch_options: dict = {}
    row_task = run_trial
    if storage is not None and storage._block_document_id is not None:
        # Prefect's own task results persist to the same storage (a saved block is required).
        # cache_policy=None: with NO_CACHE Prefect computes no key and silently writes nothing.
        persisted = dict(cache_policy=None, persist_result=True, result_storage=storage, result_serializer="json")
        batch_options = dict(**persisted, result_storage_key=f"{run_id}/rows-from-{{parameters[first_index]}}.json")
        row_task = run_trial.with_options(**persisted, result_storage_key=f"{run_id}/row-{{parameters[index]}}.json")
    resolver = TaskResolver(config, cache_dir=run.trials_dir / "_fetched", logger=logger)
    progress = Progress(info.rows)
    per_task_run = rows_per_task_run or default_rows_per_task_run(info.rows - len(kept), config.n_concurrent)
    await progress.start()
    logger.info(
        f"Sweep {run_id}: {info.rows} rows from {dataset} ({info.problems} unusable), {config.task_mode} mode, "
        f"agent {config.agent_spec}, {config.n_concurrent} at a time; results under {store.uri()}"
    )

    tally = RunTally()
    tracker = RowTracker(info.ids)
    for result in kept.values():
        tally.add(result)
        tracker.set(result.row_id, result.status)
    kept_indexes = frozenset(kept)  # the kept rows themselves are in the tally and the store
    del kept
    running: dict[str, asyncio.Task[None]] = {}

    async def serve_control() -> None:
        """Publish row status and answer partial-cancellation requests, every second."""
        answered: set[str] = set()
        published = -1
        while True:
            try:
                published = await answer_requests(answered, published)
            except Exception as error:  # storage hiccups must not stop status or the sweep
                logger.debug(f"Control channel unavailable: {error}")
            await asyncio.sleep(CONTROL_POLL_SECONDS)

    async def answer_requests(answered: set[str], published: int) -> int:
        for name in await asyncio.to_thread(store.list_names, CONTROL_FOLDER):
            if not name.endswith(".json") or name.endswith(".result.json") or name in answered:
                continue
            answered.add(name)
            try:
                request = CancelRequest.model_validate_json(await asyncio.to_thread(store.read_bytes, f"{CONTROL_FOLDER}/{name}"))
            except (ValueError, OSError) as error:
                logger.warning(f"Ignoring unreadable control request {name}: {error}")
                continue
            dispositions, to_cancel = tracker.apply(request)
            logger.warning(f"Cancel request {request.request_id}: {dict(list(dispositions.items())[:20])}")
            for row_id in to_cancel:
                if row_id in running:
                    running[row_id].cancel()
            if request.all:
                scope.request("all rows were cancelled")
            await asyncio.to_thread(store.write_bytes, request.result_path, json.dumps(dispositions).encode())
        if tracker.version != published:
            await asyncio.to_thread(store.write_bytes, STATUS_FILE, tracker.snapshot("Running"))
        return tracker.version

    archiver = Archiver(backend=config, store=store, run=run, redactor=redactor)

    async def record(result: RowResult) -> RowResult:
        result = redactor.model(result)  # rows that never reached the archiver (internal errors) too
        if result.artifact_uri is None:  # rows the flow cancelled or that never ran; the others were archived (and logged) in their task run
            result = await asyncio.to_thread(archiver, result, logger)
            log_outcome(result, logger)
        await asyncio.to_thread(store.write_row, result)
        tally.add(result)
        await progress.advance()
        return result

    distributed = not isinstance(get_run_context().task_runner, ThreadPoolTaskRunner)
    if distributed:
        logger.info(f"Rows run on {type(get_run_context().task_runner).__name__}, one task run each; trial directories stay on its workers")
    elif per_task_run > 1:
        logger.info(f"Up to {per_task_run} rows per task run (rows_per_task_run)")

    async def run_one(row: DatasetRow | RowProblem, index: int, trial_name: str) -> RowResult:
        """The row's trial: inline, inside the lane's task run, or as its own task run on the distributed runner."""
        if not distributed:
            on_grading = lambda: tracker.set(row.id, "grading")  # noqa: E731
            return await trial_and_archive(row, index, trial_name, config, resolver, run, archiver, get_run_logger(), on_grading)
        # Not quoted: the annotation would reach the worker unresolved. Pickled once per row.
        future = row_task.submit(row, index, trial_name, config, resolver, run, archiver)
        try:
            (result,) = await rows_of(future)
            return result
        except asyncio.CancelledError:
            future.wrapped_future.cancel()  # a queued row never starts; a running one ends with its worker task
            raise

    async def one_row(index: int, row: DatasetRow | RowProblem) -> RowResult:
        trial_name = trial_name_for(row.id)

        def deliberate() -> bool:
            return scope.requested.is_set() or row.id in tracker.cancelled_ids

        try:
            if deliberate():  # cancelled while queued, or the sweep stopped before the row began
                result = cancelled_result(base_result(row, index, config), None, None, started=False)
            else:
                tracker.set(row.id, "running")
                result = await run_one(row, index, trial_name)
        except asyncio.CancelledError:
            if not deliberate():
                raise
            asyncio.current_task().uncancel()  # we asked for it: record the row, then finish
            result = cancelled_result(base_result(row, index, config), run, trial_name, started=True)
        except Exception as error:  # a bug must cost one row, never the sweep
            if deliberate():
                result = cancelled_result(base_result(row, index, config), run, trial_name, started=True)
            else:
                logger.exception(f"Row {row.id} crashed the trial task")
                result = internal_error(row, index, error)
        tracker.set(row.id, result.status)
        return await asyncio.shield(record(result))

    async def start_row(index: int, row: DatasetRow | RowProblem) -> RowResult:
        """Run the row as its own asyncio task, so a partial cancel request can stop just this row."""
        running[row.id] = asyncio.create_task(one_row(index, row))
        try:
            return await running[row.id]
        finally:
            running.pop(row.id, None)

    rows = enumerate(iter_rows(dataset) if reruns is None else rerun_rows(iter_rows(dataset), reruns))

    def admit() -> tuple[int, DatasetRow | RowProblem] | None:
        """The next row to run, read from the dataset only now (a lane is free): None when done or stopping."""
        if scope.requested.is_set():
            return None
        for index, row in rows:
            if index in kept_indexes:
                progress.skip()
                continue
            return index, row
        return None

    batch_task = lane_task(admit, start_row, **batch_options)

    async def lane() -> None:
        """Run rows one after another until the dataset is done or the sweep stops."""
        while (item := admit()) is not None:
            index, row = item
            if distributed:
                await start_row(index, row)
                continue
            label = f"row {row.id}" if per_task_run == 1 else f"rows from {row.id}"
            try:
                state = await batch_task(label, index, row, per_task_run, return_state=True)
                await rows_of(state)  # raises what the task run raised, if it did not return its rows' state
            except Exception as error:  # Prefect could not run the task run (its API is away): the rows it held are not lost
                logger.exception(f"The task run for {label} failed")
                if tracker.statuses.get(row.id) == "queued":
                    tracker.set(row.id, "failure")
                    await asyncio.shield(record(internal_error(row, index, error)))

    def internal_error(row: DatasetRow | RowProblem, index: int, error: Exception) -> RowResult:
        return base_result(row, index, config).model_copy(
            update={"err_category": "agent_error", "err_message": f"internal error: {type(error).__name__}: {error}"}
        )

    try:
        async with CancelScope(get_run_context().flow_run.id, logger) as scope:
            control = asyncio.create_task(serve_control())
            lanes = {asyncio.create_task(lane()) for _ in range(config.n_concurrent)}
            await wait_or_cancel(lanes, scope, cancel=lambda: list(running.values()))
            never_started = [(index, row) for index, row in rows if index not in kept_indexes]
            if never_started:
                await asyncio.to_thread(record_never_started, store, never_started, config, tally)
                for _, row in never_started:
                    tracker.set(row.id, "cancelled")
            control.cancel()
    except BaseException as error:
        heartbeat.cancel()
        manifest.state = "Cancelled" if isinstance(error, asyncio.CancelledError) else "Failed"
        manifest.finished_at, manifest.rows_written = now(), tally.rows
        await asyncio.shield(asyncio.to_thread(store.write_manifest, manifest))
        raise

    results_uri = await asyncio.to_thread(store.finalize)
    manifest.state = "Cancelled" if scope.requested.is_set() else "Completed"
    manifest.finished_at, manifest.results_uri, manifest.rows_written = now(), results_uri, tally.rows
    await asyncio.to_thread(store.write_bytes, STATUS_FILE, tracker.snapshot(manifest.state))
    await asyncio.to_thread(store.write_manifest, manifest)
    heartbeat.cancel()
    summary = tally.summary(run_id, results_uri, local_fallback=str(store.fallback_dir) if store.unsent else None, unsent_files=store.unsent)
    await progress.finish(tally.rows)
    await publish(summary, tally)
    if store.unsent:
        logger.error(f"Storage stayed unavailable: {len(store.unsent)} file(s) are kept locally under {store.fallback_dir}")
    logger.info(summary.headline())
    if scope.requested.is_set():
        return Cancelled(message=f"Sweep cancelled ({scope.reason}); {summary.headline()}", data=summary)
    return Completed(message=summary.headline(), data=summary)


#: The default batch: about this many task runs per lane, and never more than this many rows in one.
TASK_RUNS_PER_LANE = 10
MAX_ROWS_PER_TASK_RUN = 100


async def rows_of(ran: State | PrefectFuture) -> list[RowResult]:
    """The rows a trials task run returned in its (Completed, Failed or Cancelled) state, or what it raised."""
    if isinstance(ran, PrefectFuture):
        value = await asyncio.to_thread(ran.result, raise_on_failure=False)
    else:
        value = await ran.aresult(raise_on_failure=False)
    if isinstance(value, BaseException):
        raise value
    return value


def archive_build_logs(store: RunStore, prewarmed: list[PrewarmResult], redactor: Redactor) -> None:
    """Keep the log of every image this run's prewarm built (or failed to) in the run folder."""
    for result in prewarmed:
        if result.build_log and Path(result.build_log).is_file():
            text = Path(result.build_log).read_text(errors="replace")
            store.write_bytes(f"prewarm/{path_safe(result.task)}.build.log", redactor.text(text).encode())


def run_secrets(config: HarborBackend, storage: ResultsStorage | None) -> list[str]:
    """Every secret value the run knows: the native agent's and the model endpoint's keys, and the storage's credentials."""
    found = secret_values(config.native_agent_kwargs) + endpoint_secrets(config)
    if storage is not None and storage.secret_access_key is not None:
        found.append(storage.secret_access_key.get_secret_value())
    return found


def default_rows_per_task_run(rows: int, lanes: int) -> int:
    """One row per task run for small sweeps (each row visible in the UI), batches for big ones."""
    return max(1, min(MAX_ROWS_PER_TASK_RUN, math.ceil(rows / (lanes * TASK_RUNS_PER_LANE))))


def endpoint_secrets(config: HarborBackend) -> list[str]:
    """The model endpoint's key, and Harbor's masked form of it (``sk-t****xyz``, which still
    shows seven of its characters): scrubbed from every trial tree before anything is archived."""
    endpoint = config.model_endpoint
    if endpoint is None or endpoint.api_key is None or not endpoint.api_key.get_secret_value():
        return []
    key = endpoint.api_key.get_secret_value()
    masked = redact_sensitive_value(key)
    return [key] if masked == "****" else [key, masked]


#: Backend fields that change capacity or local paths, not what a row computes.
RESUMABLE_DIFFERENCES = frozenset({"n_concurrent", "max_queue_depth", "trials_dir"})


def prepare_resume(store: RunStore, manifest: RunManifest, fingerprint: str) -> tuple[RunManifest, dict[int, RowResult]]:
    """Check that the run can be continued; keep its finished rows, drop the rest.

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
    kept = {r.row_index: r for r in store.read_results() if r.status in ("success", "failure")}
    store.restart_from(list(kept.values()))
    resumed = previous.model_copy(update={"state": "Running", "flow_run_id": manifest.flow_run_id, "finished_at": None, "resumed": previous.resumed + 1})
    return resumed, kept


def rerun_ids(previous: RunStore, dataset_ids: list[str]) -> dict[str, str]:
    """Original id -> new id for the previous run's failed and cancelled rows, in dataset order."""
    failed = {r.row_id for r in previous.read_results() if r.status in ("failure", "cancelled")}
    if not failed:
        raise ConfigurationError(f"rerun_failed: {previous.uri()} has no failed or cancelled rows (or no results).")
    return {row_id: f"{row_id}~rerun" for row_id in dataset_ids if row_id in failed}


def rerun_rows(rows, reruns: dict[str, str]):
    """Only the rows to re-run, under their new ids; the original id stays in their metadata."""
    for row in rows:
        if row.id in reruns:
            update = {"id": reruns[row.id]}
            if isinstance(row, DatasetRow):
                update["metadata"] = {**row.metadata, "original_row_id": row.id}
            yield row.model_copy(update=update)


def record_never_started(store: RunStore, rows, config: HarborBackend, tally: RunTally, batch: int = 1000) -> None:
    """Rows that never reached a sandbox are still result rows: ``cancelled``, in batches."""
    results = (cancelled_result(base_result(row, index, config), None, None, started=False) for index, row in rows)
    for chunk in itertools.batched(results, batch):
        store.write_rows(list(chunk))
        for result in chunk:
            tally.add(result)
