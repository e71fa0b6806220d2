"""One event for every way a sweep can be asked to stop.

Prefect marks a run CANCELLING (UI, ``prefect flow-run cancel``, the API) and leaves the
rest to whoever launched it: ``serve()`` and workers send SIGTERM (then SIGKILL after a
grace period), while a run started as a plain process stays CANCELLING for ever. So the
sweep watches for both itself: it polls its own flow run's state, and turns SIGTERM and
SIGINT (Ctrl-C) into the same request. Whichever comes first, the flow stops admitting
rows, cancels running trials through Harbor's own path and records what happened.

A sweep killed outright (``kill -9``, a lost machine) records nothing; its flow run stays
RUNNING. :func:`mark_crashed` (the next sweep's first step, and ``prefect-harbor cleanup``)
marks such runs Crashed once their heartbeat has gone stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed

from prefect_harbor.storage.control import StaleRun

POLL_SECONDS = 1.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class CancelScope:
    """``async with CancelScope(flow_run_id, logger) as scope: ... scope.requested``."""

    def __init__(self, flow_run_id: UUID | None, logger: logging.Logger | logging.LoggerAdapter):
        self.flow_run_id = flow_run_id
        self.logger = logger
        self.requested = asyncio.Event()
        self.reason: str | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._previous: dict[int, Any] = {}

    def request(self, reason: str) -> None:
        if not self.requested.is_set():
            self.reason = reason
            self.logger.warning(f"Cancelling the sweep: {reason}")
            self.requested.set()

    async def __aenter__(self) -> CancelScope:
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.getsignal(signum)
                loop.add_signal_handler(signum, self.request, f"received {signal.Signals(signum).name}")
        if self.flow_run_id is not None:
            self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        loop = asyncio.get_running_loop()
        for signum, previous in self._previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    async def _watch(self) -> None:
        async with get_client() as client:
            while not self.requested.is_set():
                await asyncio.sleep(POLL_SECONDS)
                try:
                    run = await client.read_flow_run(self.flow_run_id)
                except Exception as error:  # the API being briefly away must not stop the sweep
                    self.logger.debug(f"Could not read the flow run's state: {error}")
                    continue
                if run.state is not None and (run.state.is_cancelling() or run.state.is_cancelled()):
                    self.request("the flow run was cancelled")


async def wait_or_cancel(pending: set[asyncio.Task[Any]], scope: CancelScope, cancel: Callable[[], Iterable[asyncio.Task[Any]]]) -> None:
    """Wait for ``pending`` to finish; on a cancellation request cancel what ``cancel`` returns
    (the tasks they wait on, so that they wind down themselves) and wait for them again."""
    while pending:
        cancelled = asyncio.ensure_future(scope.requested.wait())
        await asyncio.wait({*pending, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        cancelled.cancel()
        pending = {task for task in pending if not task.done()}
        if scope.requested.is_set():
            for task in list(cancel()):
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return


async def mark_crashed(stale: list[StaleRun], logger: logging.Logger | logging.LoggerAdapter) -> list[str]:
    """Mark each dead run Crashed: its flow run (only while still RUNNING or PENDING) and its manifest.

    Returns the run folders marked, each logged with why and how to continue it."""
    marked = []
    async with get_client() as client:
        for run in stale:
            what = "its manifest"
            try:
                flow_run = await client.read_flow_run(UUID(run.manifest.flow_run_id or ""))
                if flow_run.state is not None and flow_run.state.type in (StateType.RUNNING, StateType.PENDING):
                    result = await client.set_flow_run_state(flow_run.id, Crashed(message=f"The sweep's process is gone: {run.reason}"))
                    if result.status == SetStateStatus.ACCEPT:
                        what = f"flow run {flow_run.name} ({flow_run.id}) and its manifest"
            except (ValueError, ObjectNotFound):  # not a flow run id, or another Prefect server's
                pass
            manifest = run.manifest.model_copy(update={"state": "Crashed"})
            await asyncio.to_thread(run.store.write_now, "manifest.json", manifest.model_dump_json(indent=2).encode())
            logger.warning(f"Run {run.store.uri()} was still marked Running, but {run.reason}: marked {what} Crashed; continue it with --resume {run.store.uri()}")
            marked.append(run.store.uri())
    return marked
