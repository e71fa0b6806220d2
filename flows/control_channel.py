"""The sweep's end of the control channel: live row status out, partial-cancellation requests in.

``prefect-harbor status`` and ``cancel`` reach a running sweep only through its run folder
(``prefect_harbor.storage.control``), whatever machine launched it. So one loop here publishes
``status.json`` whenever a row's status changed and answers each ``control/cancel-*.json``
exactly once; it keeps the only state that loop needs (the requests answered, the status
version published), apart from the lanes that run the rows it may be asked to stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from prefect_harbor.flows.cancellation import CancelScope
from prefect_harbor.storage.control import CONTROL_FOLDER, STATUS_FILE, CancelRequest, RowTracker
from prefect_harbor.storage.run_store import RunStore

CONTROL_POLL_SECONDS = 1.0


class ControlChannel:
    """Publishes the rows' live status and answers cancel requests, through the run folder."""

    def __init__(
        self, store: RunStore, tracker: RowTracker, logger: logging.Logger | logging.LoggerAdapter, status_file: str = STATUS_FILE, answers: bool = True,
    ) -> None:  # fmt: skip
        """A shard of a sweep on many hosts (``flows/sharding.py``) publishes its own rows' status to
        its own ``status_file`` and acts on requests without answering them (``answers=False``):
        the sweep's flow answers, for every host."""
        self.store = store
        self.tracker = tracker
        self.logger = logger
        self.status_file = status_file
        self.answers = answers
        self._answered: set[str] = set()
        self._published = -1

    async def serve(self, scope: CancelScope, cancel_row: Callable[[str], None]) -> None:
        """Publish row status and answer partial-cancellation requests, every second, until cancelled.

        ``cancel_row`` stops a running row; a request for all rows stops the sweep through ``scope``."""
        while True:
            try:
                await self._poll(scope, cancel_row)
            except Exception as error:  # storage hiccups must not stop status or the sweep
                self.logger.debug(f"Control channel unavailable: {error}")
            await asyncio.sleep(CONTROL_POLL_SECONDS)

    async def publish_final(self, state: str) -> None:
        """The rows' last status, under the run's final state (the loop has stopped by now)."""
        await asyncio.to_thread(self.store.write_bytes, self.status_file, self.tracker.snapshot(state))

    async def _poll(self, scope: CancelScope, cancel_row: Callable[[str], None]) -> None:
        for name in await asyncio.to_thread(self.store.list_names, CONTROL_FOLDER):
            if not name.endswith(".json") or name.endswith(".result.json") or name in self._answered:
                continue
            self._answered.add(name)  # answered once, even when unreadable
            try:
                request = CancelRequest.model_validate_json(await asyncio.to_thread(self.store.read_bytes, f"{CONTROL_FOLDER}/{name}"))
            except (ValueError, OSError) as error:
                self.logger.warning(f"Ignoring unreadable control request {name}: {error}")
                continue
            await self._answer(request, scope, cancel_row)
        if self.tracker.version != self._published:
            await asyncio.to_thread(self.store.write_bytes, self.status_file, self.tracker.snapshot("Running"))
        self._published = self.tracker.version

    async def _answer(self, request: CancelRequest, scope: CancelScope, cancel_row: Callable[[str], None]) -> None:
        """Cancel what the request names, then write its answer: each row's disposition."""
        dispositions, to_cancel = self.tracker.apply(request)
        if not self.answers:  # a shard: only its own rows, and the sweep's flow answers
            dispositions = {row_id: said for row_id, said in dispositions.items() if said != "not_found"}
        self.logger.warning(f"Cancel request {request.request_id}: {dict(list(dispositions.items())[:20])}")
        for row_id in to_cancel:
            cancel_row(row_id)
        if request.all:
            scope.request("all rows were cancelled")
        if self.answers:
            await asyncio.to_thread(self.store.write_bytes, request.result_path, json.dumps(dispositions).encode())
