"""One event for every way a sweep can be asked to stop.

Prefect marks a run CANCELLING (UI, ``prefect flow-run cancel``, the API) and leaves the
rest to whoever launched it: ``serve()`` and workers send SIGTERM (then SIGKILL after a
grace period), while a run started as a plain process stays CANCELLING for ever. So the
sweep watches for both itself: it follows its own flow run's state, and turns SIGTERM and
SIGINT (Ctrl-C) into the same request. Whichever comes first, the flow stops admitting
rows, cancels running trials through Harbor's own path and records what happened.

The state is followed on the server's event stream: the server pushes the run's state
change at once, and a quiet stream costs nothing. A read of the run's state backs it up,
every :data:`POLL_SECONDS` while the stream is down and every
:data:`POLL_BEHIND_EVENTS_SECONDS` while it is up. Reading every second cost the server
and the sweep ~8.5 ms of CPU a second: ~15 ms a quick row at 8 lanes, where one finishes
every ~1.8 s (``benchmarks/server_costs.py``).

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

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.events.clients import get_events_subscriber
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed

from prefect_harbor.storage.control import StaleRun

#: How often the run's state is read while the event stream is down.
POLL_SECONDS = 1.0
#: How often it is read while the stream is up: only a backstop for an event lost in a reconnect.
POLL_BEHIND_EVENTS_SECONDS = 30.0
#: How long to wait before subscribing again after the stream failed.
RESUBSCRIBE_SECONDS = 10.0
_STOPPING = frozenset({StateType.CANCELLING.value, StateType.CANCELLED.value})
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
        #: Whether the event stream is up, so the state need only be read now and then.
        self.following_events = False

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
            follower = asyncio.create_task(self._follow_events(client))
            try:
                await self._poll(client)
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower

    async def _poll(self, client: PrefectClient) -> None:
        """Read the run's state every second, or every ``POLL_BEHIND_EVENTS_SECONDS`` while events flow."""
        last_read = asyncio.get_running_loop().time()
        while not self.requested.is_set():
            await asyncio.sleep(POLL_SECONDS)
            now = asyncio.get_running_loop().time()
            if self.following_events and now - last_read < POLL_BEHIND_EVENTS_SECONDS:
                continue
            last_read = now
            await self._check_state(client)

    async def _check_state(self, client: PrefectClient) -> None:
        """Request the stop if the run is cancelling or cancelled now."""
        try:
            run = await client.read_flow_run(self.flow_run_id)
        except Exception as error:  # the API being briefly away must not stop the sweep
            self.logger.debug(f"Could not read the flow run's state: {error}")
            return
        if run.state is not None and (run.state.is_cancelling() or run.state.is_cancelled()):
            self.request("the flow run was cancelled")

    async def _follow_events(self, client: PrefectClient) -> None:
        """Check the run's state when the server says it is cancelling; subscribe again if the stream fails.

        The event only prompts a read: the stream replays the last minute's events on subscribing,
        and a retried run's own earlier cancel is among them."""
        runs_events = EventFilter(
            event=EventNameFilter(prefix=["prefect.flow-run."]), resource=EventResourceFilter(id=[f"prefect.flow-run.{self.flow_run_id}"])
        )
        while not self.requested.is_set():
            try:
                async with get_events_subscriber(filter=runs_events, reconnection_attempts=2) as events:  # Cloud's or a server's
                    self.following_events = True
                    async for event in events:
                        if event.resource.get("prefect.state-type") in _STOPPING:
                            await self._check_state(client)
                            if self.requested.is_set():
                                return
            except Exception as error:  # no stream (an old server, a proxy without websockets): reading the state is enough
                self.logger.debug(f"Not following the flow run's events: {error}")
            finally:
                self.following_events = False
            await asyncio.sleep(RESUBSCRIBE_SECONDS)


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
