"""One sweep on many hosts: its attempts split into shards, each a ``sweep-shard`` flow run that
a worker on some host runs, all writing into the one run folder on shared storage.

Why shards of flow runs and not deferred tasks (measured, ``docs/multi-host.md``): a process
worker stops a cancelled shard's rows in 0.5 s, a shard is one process group on one host, and
a worker's ``--limit`` takes no run it has no room for; task workers neither follow a cancel nor
notice a dead host. Rows go to shards by their Harbor task (:class:`ShardSplit`), so a task's
rows run on one host, which builds its image once.

The sweep's flow (:class:`Shards`) launches the shards (``run_deployment``: subflows of the sweep
in the UI), then until each has ended:

- merges the shards' status files into the run's ``status.json`` and answers cancel requests
  for every host (each shard reads the same requests and stops its own rows);
- on a cancel of the sweep, sets every shard Cancelling (Cancelled while still scheduled): its
  worker stops it;
- runs a shard again, once, when it crashed or failed, or its heartbeat went stale (its host
  died): the new shard skips every attempt that has a part, so no row is counted twice.

Then every attempt still without a part is recorded cancelled, and the parts become the run's
one ``results.parquet``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import fsspec.utils
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Cancelling, Crashed

from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.reporting import Progress
from prefect_harbor.rows.attempts import Row, RowAttempt
from prefect_harbor.rows.dataset import DatasetRow
from prefect_harbor.storage.control import Heartbeat, RowTracker
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore

#: The ``sweep-shard`` deployment a sweep on many hosts starts its shards from (``deployments/prefect.yaml``).
SHARD_DEPLOYMENT = "sweep-shard/shard"
SHARD_FOLDER = "shards"
#: How often the sweep looks at its shards: their states, heartbeats and status files.
WATCH_SECONDS = 2.0
#: How many times a shard that died is run again.
SHARD_RERUNS = 1
_ENDED = frozenset({StateType.COMPLETED, StateType.CANCELLED, StateType.FAILED, StateType.CRASHED})

Logger = logging.Logger | logging.LoggerAdapter


def status_file(shard: int) -> str:
    return f"{SHARD_FOLDER}/shard-{shard}.status.json"


def heartbeat_file(shard: int) -> str:
    """The shard's sign of life: the sweep runs its rows again when it goes stale."""
    return f"{SHARD_FOLDER}/shard-{shard}.heartbeat.json"


@dataclass(frozen=True)
class ShardSplit:
    """Which shard runs which attempt: a task's rows on one shard, tasks dealt out in turn (by
    their sorted ids); rows without a task id (template mode, a row's own ``harbor_task``) by position."""

    shards: int
    task_ids: tuple[str, ...]

    def shard_of(self, index: int, row: Row) -> int:
        task = row.task_id if isinstance(row, DatasetRow) else None
        if task is not None and task in self.task_ids:
            return self.task_ids.index(task) % self.shards
        return index % self.shards

    def tasks_of(self, shard: int) -> list[str]:
        """The tasks whose rows run on ``shard`` (the ones it prewarms)."""
        return [task for number, task in enumerate(self.task_ids) if number % self.shards == shard]


# An enum, not a Literal: the run form draws a one-value Literal as a constant nobody can pick,
# and an enum as a list to choose it from. Its docstring is the form's help text.
class Auto(StrEnum):
    """One shard per worker online on the sweep-shard deployment's work pool."""

    AUTO = "auto"


async def shard_count(shards: int | str) -> int | None:
    """How many shards the sweep runs on: None for this host alone (``shards=1``), else the count,
    ``"auto"`` being one per worker online on the shards' pool. The shards' deployment (and for
    ``"auto"`` a worker) is checked to be there before anything starts."""
    if shards != Auto.AUTO and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 1):
        raise ConfigurationError(f"shards: {shards!r} is not a host count; give 1 (this host), more, or 'auto' (one per worker online).")
    if shards == 1:
        return None
    async with get_client() as client:
        try:
            deployment = await client.read_deployment_by_name(SHARD_DEPLOYMENT)
        except ObjectNotFound:
            raise ConfigurationError(
                f"shards: the {SHARD_DEPLOYMENT} deployment is not on this Prefect server; deploy it with "
                "`prefect deploy --prefect-file deployments/prefect.yaml --all` and start a worker on each host "
                "(`prefect worker start --pool harbor-process --limit 1`)."
            ) from None
        if shards != Auto.AUTO:
            return int(shards)
        pool = deployment.work_pool_name
        online = WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
        workers = await client.read_workers_for_work_pool(pool, worker_filter=online) if pool else []
    if not workers:
        raise ConfigurationError(
            f"shards: 'auto' runs one shard per worker online on the {pool or '(none)'} work pool, and none is; start one on each host "
            f"(`prefect worker start --pool {pool or 'harbor-process'} --limit 1`) or give a number."
        )
    return len(workers)


def refuse_unshareable(shards: int, results_root: str, backend_block: str | None, storage: Any, storage_block: str | None) -> None:
    """What a sweep on many hosts needs before anything starts: a results root every host can reach,
    and blocks the hosts can load by name (secrets never travel as parameters)."""
    if fsspec.utils.get_protocol(results_root) in ("file", "local"):
        raise ConfigurationError(
            f"results: a sweep on {shards} shards writes one run folder from every host, and {results_root!r} is a local path the other hosts "
            "cannot reach; give an s3:// (or other fsspec) URL every host can reach, or a Results Storage block (storage_block)."
        )
    if backend_block is None:
        raise ConfigurationError("backend: a sweep on many hosts hands each host its backend by name; save it as a Harbor Backend block and give backend_block.")
    if storage is not None and storage_block is None:
        raise ConfigurationError("storage: a sweep on many hosts hands each host its storage by name; save it as a Results Storage block and give storage_block.")


@dataclass
class _Shard:
    flow_run: FlowRun
    #: How many times it has been started (a shard that died runs again, up to SHARD_RERUNS).
    runs: int = 1


@dataclass
class Shards:
    """The sweep's side of a sweep on many hosts (see the module docstring)."""

    count: int
    #: The shard flow's parameters less ``shard``: the run folder, the dataset, the blocks by name, the overrides.
    parameters: dict[str, Any]
    store: RunStore
    tracker: RowTracker
    progress: Progress
    logger: Logger
    #: What makes this sweep's shard runs its own: its flow run and that run's count (a resumed
    #: sweep, or a Prefect Retry, writes into the same run folder and must not get the old shards back).
    launch_key: str
    deployment: str = SHARD_DEPLOYMENT
    _live: dict[int, _Shard] = field(default_factory=dict, init=False)

    async def run(self, stop: asyncio.Event) -> None:
        """Launch every shard and watch them until each has ended; on ``stop``, cancel them."""
        async with get_client() as client:
            for number in range(self.count):
                self._live[number] = _Shard(await self._launch(number, 1))
            stopping = False
            while self._live:
                if stop.is_set() and not stopping:
                    stopping = True
                    await self._cancel_all(client)
                await self._look(client, stopping)
                if self._live:
                    await asyncio.sleep(WATCH_SECONDS)
            await asyncio.to_thread(self._merge_status)

    async def _launch(self, number: int, runs: int) -> FlowRun:
        flow_run = await run_deployment(
            self.deployment, parameters={**self.parameters, "shard": number, "shards": self.count}, timeout=0, as_subflow=True,
            idempotency_key=f"{self.launch_key}:shard-{number}:{runs}",
        )  # fmt: skip
        self.logger.info(f"Shard {number + 1} of {self.count}: flow run {flow_run.name} ({flow_run.id}) on {self.deployment}")
        return flow_run

    async def _look(self, client: PrefectClient, stopping: bool) -> None:
        await asyncio.to_thread(self._merge_status)
        await self.progress.reach(self.tracker.finished)
        for number, shard in list(self._live.items()):
            flow_run = await client.read_flow_run(shard.flow_run.id)
            state = flow_run.state
            died = self._died(number, flow_run) if state is not None and state.type == StateType.RUNNING else None
            if died:
                await client.set_flow_run_state(flow_run.id, Crashed(message=f"The shard's process is gone: {died}"), force=True)
            elif state is None or state.type not in _ENDED:
                continue
            del self._live[number]
            ended = died or f"ended {state.name}: {state.message or ''}".strip()
            if stopping or (state.type in (StateType.COMPLETED, StateType.CANCELLED) and not died):
                continue
            if shard.runs > SHARD_RERUNS:
                self.logger.error(f"Shard {number + 1} ({flow_run.name}) {ended}; it ran {shard.runs} times: its rows without a result are recorded cancelled")
                continue
            self.logger.warning(f"Shard {number + 1} ({flow_run.name}) {ended}: its rows without a result run again, on whichever host takes them")
            self._live[number] = _Shard(await self._launch(number, shard.runs + 1), shard.runs + 1)

    def _died(self, number: int, flow_run: FlowRun) -> str | None:
        """Why a shard whose flow run still says Running is dead (its heartbeat went stale), or None."""
        try:
            beat = Heartbeat.model_validate_json(self.store.read_bytes(heartbeat_file(number)))
        except (FileNotFoundError, ValueError):
            return None  # not started yet
        if beat.flow_run_id != str(flow_run.id):
            return None  # the beat of the run before it: this one has not beaten yet
        return beat.stale()

    async def _cancel_all(self, client: PrefectClient) -> None:
        for shard in self._live.values():
            flow_run = await client.read_flow_run(shard.flow_run.id)
            if flow_run.state is None or flow_run.state.type in _ENDED:
                continue
            scheduled = flow_run.state.type in (StateType.SCHEDULED, StateType.PENDING)
            await client.set_flow_run_state(flow_run.id, Cancelled() if scheduled else Cancelling(), force=True)
        self.logger.warning(f"Cancelling the sweep's {len(self._live)} running shard(s)")

    def _merge_status(self) -> None:
        """Each shard's rows' status into the run's tracker (``status.json`` is published from it)."""
        for number in range(self.count):
            try:
                document = json.loads(self.store.read_bytes(status_file(number)))
            except (FileNotFoundError, ValueError):
                continue
            hosts = document.get("hosts", {})
            for row_id, attempts in document.get("attempts", {}).items():
                for attempt, status in attempts.items():
                    self.tracker.set(row_id, status, int(attempt), host=hosts.get(row_id))
            if "attempts" not in document:
                for row_id, status in document.get("rows", {}).items():
                    self.tracker.set(row_id, status, host=hosts.get(row_id))


def missing(units: Iterable[RowAttempt], recorded: list[RowResult]) -> list[RowAttempt]:
    """The attempts no shard recorded (their shard never ran, or died for good)."""
    done = {(r.row_index, r.attempt) for r in recorded}
    return [unit for unit in units if unit.key not in done]
