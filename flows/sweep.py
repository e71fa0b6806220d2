"""The ``evaluation-sweep`` flow: a dataset fanned out into one Harbor trial per row.

The flow body is the sweep's steps, in order; what the steps share lives in objects with one
job each: the run folder (``run_folder.py``: manifest, heartbeat), the rows this run is about
(``selection.py``), the recorder of result rows (``recorder.py``), the lanes that admit and
run rows (``lanes.py``) and the control channel (``control_channel.py``: status, cancel requests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harbor.utils.env import redact_sensitive_value
from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.logging.handlers import APILogHandler
from prefect.states import Cancelled, Completed, State

from prefect_harbor.agents.harness import BundleRuntime
from prefect_harbor.agents.native import prepare_native_agent
from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.certification import CertificationStore, gate
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows import figures
from prefect_harbor.flows.bundle import build_bundle_flow
from prefect_harbor.flows.cancellation import CancelScope
from prefect_harbor.flows.configuration import (
    Reference,
    backend_block_name,
    check_process_budget,
    install_log_filters,
    picked,
    resolve_backend,
    resolve_storage,
    sweep_logs,
)
from prefect_harbor.flows.control_channel import ControlChannel
from prefect_harbor.flows.headline import SWEEP_CANCELLED, keep_the_headline
from prefect_harbor.flows.lanes import Admission, LanePlan, Lanes, TrialRunner, record_cancelled
from prefect_harbor.flows.prewarm import prewarm_all
from prefect_harbor.flows.recorder import Recorder
from prefect_harbor.flows.reporting import Progress, RowsTable, publish, run_tags, sweep_run_name, tag_flow_run
from prefect_harbor.flows.run_folder import RunFolder, current_flow_run_id
from prefect_harbor.flows.selection import Selection
from prefect_harbor.flows.sharding import SHARD_DEPLOYMENT, Auto, Shards, missing, refuse_unshareable, shard_count
from prefect_harbor.host import host_name
from prefect_harbor.rows.attempts import RowAttempt
from prefect_harbor.rows.dataset import path_safe
from prefect_harbor.rows.sources import TaskResolver
from prefect_harbor.sandbox.janitor import reap_orphans
from prefect_harbor.sandbox.proxy import proxy_secrets
from prefect_harbor.secrets import Redactor, secret_values
from prefect_harbor.spec import BackendSpec
from prefect_harbor.stats.stopping import StoppedEarly, StopRule, check_stopping
from prefect_harbor.storage.control import RowTracker
from prefect_harbor.storage.results import RowResult, RunTally, SweepSummary
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.tasks import SweepContext
from prefect_harbor.trial.prewarm import PrewarmResult, prewarm_targets
from prefect_harbor.trial.row_trial import RunContext
from prefect_harbor.trial.task_env import passed_through_secrets

install_log_filters()

Logger = logging.Logger | logging.LoggerAdapter


# validate_parameters=False: a block picked in the run form arrives as a reference, loaded (or
# refused, naming the field) as a block given by name is (configuration.picked); Prefect's own
# validation would refuse a bad one before the run is named or tagged, in words nobody can act
# on. on_cancellation: headline.py.
@flow(name="evaluation-sweep", flow_run_name=sweep_run_name, retries=0, validate_parameters=False, on_cancellation=[keep_the_headline])
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
    rerun_agent_failures: bool = False,
    prewarm: bool = True,
    rows_per_task_run: int | None = None,
    attempts: int | None = None,
    stop_at_ci_width: float | None = None,
    shards: int | Auto = 1,
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
        rerun_failed: The folder of an earlier run: a new run of only its attempts that
            measured nothing (not scored: sandbox, setup, verifier...; or cancelled), with new
            row ids (<id>~rerun) that point to the originals. Scored attempts never run again.
        rerun_agent_failures: With rerun_failed, also run its agent failures again (errors
            and timeouts of the agent, which the mean counts as 0).
        prewarm: First set up each selected task once (install-only, no credentials); the
            rows of a task that fails it fail at once with its reason.
        rows_per_task_run: How many rows one Prefect task run may hold. Empty: one per row
            up to 40 rows at 4 at a time, then more (about ten task runs per lane, at most
            100 rows each), because Prefect's cost per task run outweighs a quick trial's.
        attempts: Overrides the backend's attempts for this run: independent trials per row,
            each with its own result row and archive (pass@k for k up to this).
        stop_at_ci_width: Overrides the backend's: run the attempts in rounds (every row's
            attempt 1, then 2, ...) and stop after the round whose mean has a 95% interval
            this narrow; attempts is then the most a row may get.
        shards: Spread the rows over this many hosts: each shard is a run of the sweep-shard
            deployment, taken by a worker on its pool (a task's rows stay on one host); "auto":
            one shard per worker online on that pool. Needs results every host can reach
            (s3://…) and the blocks by name.

    Rows run in ``n_concurrent`` lanes; a lane reads the next row from the dataset only
    when it is free, so a large dataset never becomes thousands of pending task runs.
    Every attempt at a row yields exactly one result row, whatever happens to it.
    """
    logger = get_run_logger()
    config, block_name = await resolve_configuration(backend, backend_block, concurrency, rows_per_task_run, logger, attempts, stop_at_ci_width)
    spec = config.spec()  # what every step below takes; the block itself stays for the subflow and the manifest
    await remove_orphaned_containers(spec, logger)
    storage = await resolve_storage(await picked(ResultsStorage, storage, "storage"), storage_block)
    check_stopping(spec.limits.stop_at_ci_width, spec.limits.attempts, sharded=shards != 1, rerun=rerun_failed is not None)
    if sharded := await shard_count(shards):
        shard_parameters = sharing(
            sharded, dataset, block_name, storage, storage_block, results, concurrency, attempts, rerun_failed, rerun_agent_failures, prewarm,
            rows_per_task_run,
        )  # fmt: skip
        logger.info(f"Spreading the rows over {sharded} shard(s) of {SHARD_DEPLOYMENT}")
    runtimes = await prepare_runtimes(config, storage, logger)
    with sweep_logs(runtimes.redactor):
        folder = await RunFolder.open(spec, storage, results, resume, rerun_failed, runtimes.bundle, runtimes.mounts, logger)
        selection = await Selection.inspect(dataset, rerun_failed, folder.storage_options, logger, spec.limits.attempts, rerun_agent_failures)
        tally, tracker = RunTally(), RowTracker(selection.info.ids, selection.tracked, host=None if sharded else host_name())
        configuration = runtimes.redactor.configuration(config.model_dump(mode="json"))
        kept = count_kept(await folder.begin(selection.info, configuration, block_name, rerun_failed), tally, tracker)  # counted, not held
        try:  # from here the manifest says Running and the heartbeat beats: whatever stops the run must say so
            await figures.open_job(folder, spec, selection.units, runtimes.redactor, logger)
            task_ids = await check_certifications(spec, folder, selection.info.task_ids, logger) if not sharded else []  # shards check their own
            run = await prewarm_tasks(spec, folder, task_ids, runtimes.redactor) if prewarm and not sharded else folder.run  # and prewarm their own
            plan = LanePlan.of(spec, storage, folder.run_id, selection.units - len(kept), rows_per_task_run)
            resolver = TaskResolver(spec.sources, cache_dir=run.trials_dir / "_fetched", logger=logger)
            sweep = SweepContext(backend=spec, resolver=resolver, run=run, store=folder.store, redactor=runtimes.redactor)
            recorder = Recorder(sweep, Progress(selection.units), RowsTable(tally, selection.units), tally, logger)
            await recorder.start()
            announce(spec, folder, selection, plan, logger)
            trials = TrialRunner(sweep, plan)
            channel = ControlChannel(folder.store, tracker, logger)
            early: StoppedEarly | None = None
            if sharded:
                scope = await run_shards(sharded, folder, selection, kept, recorder, channel, logger, shard_parameters)
            elif (width := spec.limits.stop_at_ci_width) is not None:
                scope, early = await run_rounds(StopRule(width, spec.limits.attempts), plan, trials, selection, kept, recorder, channel, logger)
                spec = early.spec_of(spec) if early is not None else spec
            else:
                scope = await run_lanes(plan, trials, selection.attempts_to_run(), kept, recorder, channel, logger)
            summary = await finalize(folder, recorder, channel, spec, logger, stopped=scope.requested.is_set(), early=early)
        except BaseException as error:
            await folder.fail(error, tally.rows)
            raise
        return await publish_summary(summary, recorder, scope, folder.superseded, logger)


async def resolve_configuration(
    backend: HarborBackend | Reference | None, backend_block: str | None, concurrency: int | None, rows_per_task_run: int | None, logger: Logger,
    attempts: int | None = None, stop_at_ci_width: float | None = None,
) -> tuple[HarborBackend, str | None]:  # fmt: skip
    """The backend this run uses (loaded by name or from the picker's reference, or the inline block
    re-validated) and its block's name.

    The flow run is tagged with what it runs first, so even a run that fails later is found by its
    tags; a run whose block is not valid, by its block's."""
    if get_run_context().flow.retries:
        raise ConfigurationError(
            "retries: a sweep is retry-free (a retry is a new row id): drop retries from evaluation_sweep.with_options(...), "
            "and re-run failures explicitly with rerun_failed / --rerun-failed."
        )
    if rows_per_task_run is not None and rows_per_task_run < 1:
        raise ConfigurationError(f"rows_per_task_run: {rows_per_task_run} is not a row count; give 1 or more, or leave it empty for the default.")
    if attempts is not None and attempts < 1:
        raise ConfigurationError(f"attempts: {attempts} is not an attempt count; give 1 or more, or leave it empty for the backend's.")
    block_name = await backend_block_name(backend, backend_block)
    try:
        config = await resolve_backend(await picked(HarborBackend, backend, "backend"), backend_block)
    except ConfigurationError:  # found by its block's tag all the same
        await tag_run([f"backend:{block_name}"] if block_name else [], logger)
        raise
    tags = run_tags(config, block_name)
    logger.info(f"Backend {'block ' + repr(block_name) if block_name else '(inline)'}: " + ", ".join(tags))
    await tag_run(tags, logger)
    if concurrency is not None:
        config = config.model_copy(update={"n_concurrent": concurrency})
    if attempts is not None:
        config = config.model_copy(update={"attempts": attempts})
    if stop_at_ci_width is not None:
        config = config.model_copy(update={"stop_at_ci_width": stop_at_ci_width})  # checked by the sweep, with its shards and rerun
    check_process_budget(config)
    return config, block_name


async def tag_run(tags: list[str], logger: Logger) -> None:
    """Add ``tags`` to this flow run (filterable in the UI)."""
    if not tags:
        return
    try:
        await tag_flow_run(current_flow_run_id(), tags)
    except Exception as error:  # outside a server-backed run (or an old server): names only
        logger.debug(f"Could not tag the flow run: {error}")


async def remove_orphaned_containers(config: BackendSpec, logger: Logger) -> None:
    """Containers of runs whose process died go before this run starts any (the local sandbox's own)."""
    if config.environment.is_local_sandbox:
        for reaped in await asyncio.to_thread(reap_orphans):
            logger.warning(f"Removed container {reaped}, left behind by a run whose process died.")


@dataclass(frozen=True)
class Runtimes:
    """What the run prepares once for all its trials, and the redactor of the secrets it knows."""

    bundle: BundleRuntime | None
    #: Read-only mounts of prepared agent runtimes (mini-swe-agent's environment).
    mounts: tuple[dict, ...]
    redactor: Redactor


async def prepare_runtimes(config: HarborBackend, storage: ResultsStorage | None, logger: Logger) -> Runtimes:
    """The workflow bundle and the native agent's runtime, before anything is written: a project
    that cannot be bundled is a configuration error."""
    bundle = await build_bundle_flow(backend=config) if config.has_bundle else None
    mounts = tuple(await asyncio.to_thread(prepare_native_agent, config.agent, logger=logger)) if config.is_native else ()
    return Runtimes(bundle, mounts, Redactor.of(run_secrets(config, storage)))


def count_kept(kept: dict[tuple[int, int], RowResult], tally: RunTally, tracker: RowTracker) -> frozenset[tuple[int, int]]:
    """A resumed run's finished attempts, counted and their status known; only their keys stay (the flow keeps no rows)."""
    for result in kept.values():
        tally.add(result)
        tracker.set(result.row_id, result.status, result.attempt)
    return frozenset(kept)


async def check_certifications(spec: BackendSpec, folder: RunFolder, task_ids: list[str], logger: Logger) -> list[str]:
    """Give the run each selected task's certification (by its current content); the task ids
    still to run: all, unless Certified Tasks Only refuses some (whose rows then fail unscored)."""
    folders = {t.name: t.path for t in prewarm_targets(spec, task_ids) if not isinstance(t, str)}
    store = CertificationStore(figures.results_root(folder.store), folder.storage_options)
    found = await asyncio.to_thread(gate, folders, store, spec.scoring.certified_tasks_only)
    folder.run = dataclasses.replace(folder.run, certifications=found.labels, uncertified=found.refused)
    for reason in found.refused.values():
        logger.warning(f"Certified tasks only: {reason}")
    return [name for name in task_ids if str(folders.get(name)) not in found.refused]


async def prewarm_tasks(config: BackendSpec, folder: RunFolder, task_ids: list[str], redactor: Redactor) -> RunContext:
    """Set up each selected task once; the run context that fails the rows of a task whose prewarm failed."""
    prewarmed = await prewarm_all(config, folder.run, task_ids)
    await asyncio.to_thread(archive_build_logs, folder.store, prewarmed, redactor)
    return dataclasses.replace(folder.run, prewarm_failures={r.task: r.error or "prewarm failed" for r in prewarmed if not r.ok})


def announce(config: BackendSpec, folder: RunFolder, selection: Selection, plan: LanePlan, logger: Logger) -> None:
    """The sweep's opening line, and where its rows run."""
    info = selection.info
    attempts = f" × {config.limits.attempts} attempts" if config.limits.attempts > 1 else ""
    logger.info(
        f"Sweep {folder.run_id}: {info.rows} rows{attempts} from {selection.dataset} ({info.problems} unusable), {config.sources.mode} mode, "
        f"agent {config.agent_name}, {config.limits.n_concurrent} at a time; results under {folder.store.uri()}"
    )
    plan.announce(logger)


async def run_lanes(
    plan: LanePlan, trials: TrialRunner, units: Iterator[RowAttempt], kept: frozenset[tuple[int, int]], recorder: Recorder, channel: ControlChannel,
    logger: Logger,
) -> CancelScope:  # fmt: skip
    """Every attempt of ``units`` to its result row, the control channel served meanwhile; the scope tells whether the sweep was stopped."""
    async with CancelScope(get_run_context().flow_run.id, logger) as scope:
        lanes = Lanes(plan, trials, Admission(units, kept, recorder, scope), recorder, channel.tracker, scope, logger)
        control = asyncio.create_task(channel.serve(scope, lanes.cancel))
        try:
            await lanes.run()
            await lanes.record_never_started()
        finally:
            control.cancel()
    return scope


async def run_rounds(
    rule: StopRule, plan: LanePlan, trials: TrialRunner, selection: Selection, kept: frozenset[tuple[int, int]], recorder: Recorder,
    channel: ControlChannel, logger: Logger,
) -> tuple[CancelScope, StoppedEarly | None]:  # fmt: skip
    """:func:`run_lanes` round by round under the stopping rule (``stats/stopping.py``): every row's attempt 1,
    then attempt 2, … until the interval is narrow enough or the attempts are spent. The second value says
    whether the rule ended the sweep before its last round (the attempts it did not need are not recorded)."""
    async with CancelScope(get_run_context().flow_run.id, logger) as scope:
        current: list[Lanes] = []
        control = asyncio.create_task(channel.serve(scope, lambda row_id: current[-1].cancel(row_id)))
        try:
            for number in range(1, rule.attempts + 1):
                current.append(Lanes(plan, trials, Admission(selection.attempts_to_run(number), kept, recorder, scope), recorder, channel.tracker, scope, logger))
                await current[-1].run()
                if scope.requested.is_set():  # this round's rest and every later round's attempts are cancelled
                    await current[-1].record_never_started()
                    later = [unit for unit in selection.attempts_to_run() if unit.attempt > number and unit.key not in kept]
                    await record_cancelled(later, recorder, channel.tracker)
                    break
                verdict = rule.after_round(number, await asyncio.to_thread(recorder.store.rows_so_far))
                logger.info(f"Stopping rule: {verdict.reason}")
                if verdict.stop and number < rule.attempts:  # after the last round the loop ends anyway
                    channel.tracker.forget_attempts_after(number)
                    recorder.expect(selection.info.rows * number)
                    return scope, StoppedEarly(number, rule.attempts, verdict.finding)
        finally:
            control.cancel()
    return scope, None


def sharing(
    shards: int, dataset: str, backend_block: str | None, storage: ResultsStorage | None, storage_block: str | None, results: str,
    concurrency: int | None, attempts: int | None, rerun_failed: str | None, rerun_agent_failures: bool, prewarm: bool,
    rows_per_task_run: int | None,
) -> dict:  # fmt: skip
    """What every shard of a sweep on many hosts is given (less its run folder and number); refused
    before anything starts when the hosts could not share it."""
    storage_name = storage_block or (storage._block_document_name if storage is not None else None)
    refuse_unshareable(shards, storage.url if storage is not None else results, backend_block, storage, storage_name)
    return {
        "dataset": dataset, "backend_block": backend_block, "storage_block": storage_name, "concurrency": concurrency, "attempts": attempts,
        "rerun_failed": rerun_failed, "rerun_agent_failures": rerun_agent_failures, "prewarm": prewarm, "rows_per_task_run": rows_per_task_run,
    }  # fmt: skip


async def run_shards(
    count: int, folder: RunFolder, selection: Selection, kept: frozenset[tuple[int, int]], recorder: Recorder, channel: ControlChannel,
    logger: Logger, parameters: dict,
) -> CancelScope:  # fmt: skip
    """The run's attempts on ``count`` shards (``flows/sharding.py``), the control channel served
    meanwhile; then every attempt the shards recorded counted, and those none did recorded cancelled."""
    flow_run = get_run_context().flow_run
    launch_key = f"{flow_run.id}:{flow_run.run_count}"
    shards = Shards(count, {**parameters, "run_folder": folder.store.uri()}, folder.store, channel.tracker, recorder.progress, logger, launch_key)
    async with CancelScope(flow_run.id, logger) as scope:
        control = asyncio.create_task(channel.serve(scope, lambda row_id: None))  # each shard stops its own rows
        try:
            await shards.run(scope.requested)
        finally:
            control.cancel()
    recorded = await asyncio.to_thread(folder.store.gather_parts)
    for result in recorded:
        if (result.row_index, result.attempt) not in kept:
            recorder.tally.add(result)
            channel.tracker.set(result.row_id, result.status, result.attempt, host=result.host)
    left = await asyncio.to_thread(missing, selection.attempts_to_run(), recorded)
    if left:
        logger.warning(f"{len(left)} attempts were run by no shard: recorded cancelled")
        await recorder.record_never_started(left)
        for unit in left:
            channel.tracker.set(unit.row.id, "cancelled", unit.attempt)
    return scope


async def finalize(
    folder: RunFolder, recorder: Recorder, channel: ControlChannel, config: BackendSpec, logger: Logger, stopped: bool, early: StoppedEarly | None = None
) -> SweepSummary:
    """The results table compacted, the final row status and manifest written; the run's summary, with its statistics (``summary.json``)."""
    results_uri, table = await asyncio.to_thread(folder.store.compact)
    state = "Cancelled" if stopped else "Completed"
    await channel.publish_final(state)
    await folder.finish(state, results_uri, recorder.tally.rows)
    summary = recorder.summary(folder.run_id, results_uri)
    if early is not None:
        summary = summary.model_copy(update={"stopped_early": early.phrase()})
    return await figures.close(folder, table, config, summary, logger)


async def publish_summary(summary: SweepSummary, recorder: Recorder, scope: CancelScope, superseded: list[str], logger: Logger) -> State:
    """The UI artifacts and the last log lines; the flow run's final state carries the summary.

    The state is named with the counts (``6/7 rewarded, mean 0.857``: what the UI's run list and
    the end of ``prefect deployment run --watch`` show) and its message is the headline."""
    await recorder.finish(summary)
    await publish(summary, recorder.tally, superseded)
    store = recorder.store
    if store.unsent:
        logger.error(f"Storage stayed unavailable: {len(store.unsent)} file(s) are kept locally under {store.fallback_dir}")
    logger.info(summary.headline())
    await flush_logs()
    name = summary.counts().name()
    if scope.requested.is_set():
        return Cancelled(name=name, message=f"{SWEEP_CANCELLED} ({scope.reason}); {summary.headline()}", data=summary)
    return Completed(name=name, message=summary.headline(), data=summary)


async def flush_logs() -> None:
    """Send the log lines so far before the final state: a watcher (``--watch``) stops at that state."""
    try:
        await APILogHandler.aflush()
    except Exception as error:  # no API log handler (logging to the API off): nothing to send
        logging.getLogger(__name__).debug(f"Logs not flushed: {error}")


def archive_build_logs(store: RunStore, prewarmed: list[PrewarmResult], redactor: Redactor) -> None:
    """Keep the log of every image this run's prewarm built (or failed to) in the run folder."""
    for result in prewarmed:
        if result.build_log and Path(result.build_log).is_file():
            text = Path(result.build_log).read_text(errors="replace")
            if result.image_source:  # which image the task's rows ran: its prebuilt one, or this build
                text = f"# {result.task}: {result.image_source}\n{text}"
            store.write_bytes(f"prewarm/{path_safe(result.task)}.build.log", redactor.text(text).encode())


def run_secrets(config: HarborBackend, storage: ResultsStorage | None) -> list[str]:
    """Every secret value the run knows: the native agent's and the model endpoint's keys, the host's proxy
    passwords, the storage's credentials, and the credentials among the host variables tasks are given
    (task_env_passthrough)."""
    found = secret_values(config.native_agent_kwargs) + endpoint_secrets(config) + proxy_secrets() + passed_through_secrets(config.task_env_passthrough)
    if storage is not None and storage.secret_access_key is not None:
        found.append(storage.secret_access_key.get_secret_value())
    return found


def endpoint_secrets(config: HarborBackend) -> list[str]:
    """The model endpoint's key, and Harbor's masked form of it (``sk-t****xyz``, which still
    shows seven of its characters): scrubbed from every trial tree before anything is archived."""
    endpoint = config.model_endpoint
    if endpoint is None or endpoint.api_key is None or not endpoint.api_key.get_secret_value():
        return []
    key = endpoint.api_key.get_secret_value()
    masked = redact_sensitive_value(key)
    return [key] if masked == "****" else [key, masked]
