"""The ``sweep-shard`` flow: one host's share of a sweep on many hosts (``flows/sharding.py``).

A worker on any host runs it; it runs the attempts of its shard that have no part in the run
folder yet, on this host's sandbox, as the sweep itself would (prewarm of its own tasks, lanes,
one task run per row, archives), writing each row's part into the shared run folder. It keeps
its own status file and heartbeat there, and stops its rows on a cancel request or when its
flow run is cancelled. It writes no manifest and no results table: the sweep's flow does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prefect import flow, get_run_logger
from prefect.states import Cancelled, Completed, State

from prefect_harbor.flows.configuration import resolve_storage, sweep_logs
from prefect_harbor.flows.control_channel import ControlChannel
from prefect_harbor.flows.lanes import LanePlan, TrialRunner
from prefect_harbor.flows.recorder import Recorder
from prefect_harbor.flows.reporting import PROGRESS_KEY, ROWS_KEY, Progress, RowsTable
from prefect_harbor.flows.run_folder import RunFolder, current_flow_run_id, start_heartbeat
from prefect_harbor.flows.selection import Selection
from prefect_harbor.flows.sharding import ShardSplit, heartbeat_file, status_file
from prefect_harbor.flows.sweep import check_certifications, prepare_runtimes, prewarm_tasks, remove_orphaned_containers, resolve_configuration, run_lanes
from prefect_harbor.host import host_name
from prefect_harbor.rows.attempts import RowAttempt
from prefect_harbor.rows.sources import TaskResolver
from prefect_harbor.storage.control import RowTracker
from prefect_harbor.storage.results import RunTally
from prefect_harbor.tasks import SweepContext


@flow(name="sweep-shard", flow_run_name="shard-{shard}-of-{shards}", retries=0, validate_parameters=False)
async def sweep_shard(
    run_folder: str,
    shard: int,
    shards: int,
    dataset: str,
    backend_block: str,
    storage_block: str | None = None,
    concurrency: int | None = None,
    attempts: int | None = None,
    rerun_failed: str | None = None,
    rerun_agent_failures: bool = False,
    prewarm: bool = True,
    rows_per_task_run: int | None = None,
) -> State:
    """Run shard ``shard`` (from 0) of ``shards`` of the sweep whose run folder is ``run_folder``.

    Started by the sweep (``evaluation-sweep`` with ``shards``), not by hand: the other
    parameters are the sweep's own."""
    logger = get_run_logger()
    config, _ = await resolve_configuration(None, backend_block, concurrency, rows_per_task_run, logger, attempts)
    spec = config.spec()
    await remove_orphaned_containers(spec, logger)
    storage = await resolve_storage(None, storage_block)
    runtimes = await prepare_runtimes(config, storage, logger)
    with sweep_logs(runtimes.redactor):
        folder = await RunFolder.join(spec, storage, run_folder, runtimes.bundle, runtimes.mounts, logger)
        selection = await Selection.inspect(dataset, rerun_failed, folder.storage_options, logger, spec.limits.attempts, rerun_agent_failures)
        split = ShardSplit(shards, tuple(selection.info.task_ids))
        done = frozenset((r.row_index, r.attempt) for r in await asyncio.to_thread(folder.store.read_results))

        def mine() -> Iterator[RowAttempt]:
            return (u for u in selection.attempts_to_run() if split.shard_of(u.index, u.row) == shard and u.key not in done)

        tracked: dict[str, list[int]] = {}
        for unit in await asyncio.to_thread(list, mine()):
            tracked.setdefault(unit.row.id, []).append(unit.attempt)
        to_run = sum(map(len, tracked.values()))
        logger.info(f"Shard {shard + 1} of {shards} on {host_name()}: {to_run} attempts of {len(tracked)} rows ({len(done)} already recorded)")
        task_ids = await check_certifications(spec, folder, split.tasks_of(shard), logger)
        run = await prewarm_tasks(spec, folder, task_ids, runtimes.redactor) if prewarm else folder.run
        plan = LanePlan.of(spec, storage, folder.run_id, to_run, rows_per_task_run)
        resolver = TaskResolver(spec.sources, cache_dir=run.trials_dir / "_fetched", logger=logger)
        sweep = SweepContext(backend=spec, resolver=resolver, run=run, store=folder.store, redactor=runtimes.redactor)
        tally = RunTally()
        keys = f"-shard-{shard}"  # the sweep's own artifacts show the whole run
        recorder = Recorder(sweep, Progress(to_run, key=PROGRESS_KEY + keys), RowsTable(tally, to_run, key=ROWS_KEY + keys), tally, logger)
        await recorder.start()
        channel = ControlChannel(folder.store, RowTracker(list(tracked), tracked, host=host_name()), logger, status_file=status_file(shard), answers=False)
        heartbeat = await start_heartbeat(folder.store, heartbeat_file(shard), current_flow_run_id(), logger)
        try:
            scope = await run_lanes(plan, TrialRunner(sweep, plan), mine(), frozenset(), recorder, channel, logger)
        finally:
            heartbeat.cancel()
        stopped = scope.requested.is_set()
        await channel.publish_final("Cancelled" if stopped else "Completed")
        await recorder.progress.finish(tally.rows)
        said = f"{tally.rows} attempts on {host_name()}"
        return Cancelled(message=f"Shard cancelled ({scope.reason}); {said}") if stopped else Completed(message=said)
