"""Live row status and partial cancellation, through the run's folder in storage.

A running sweep writes ``<run>/status.json`` (every row's status in the Osmosis
vocabulary) and reads cancellation requests that ``prefect-harbor cancel`` drops in
``<run>/control/``; it answers each with a ``.result.json`` of dispositions. The run's
folder is the channel because every process that can see the results can see it too --
on this machine or another, whatever launched the sweep.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Literal

from pydantic import BaseModel, Field

LiveStatus = Literal["queued", "running", "grading", "success", "failure", "cancelled", "unknown"]
Disposition = Literal["cancelled_queued", "cancelled_running", "not_found"]
STATUS_FILE = "status.json"
CONTROL_FOLDER = "control"


class CancelRequest(BaseModel):
    """Cancel rows of a running sweep: by id, by id prefix, or all."""

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    ids: list[str] = Field(default_factory=list)
    prefixes: list[str] = Field(default_factory=list)
    all: bool = False

    @property
    def path(self) -> str:
        return f"{CONTROL_FOLDER}/cancel-{self.request_id}.json"

    @property
    def result_path(self) -> str:
        return f"{CONTROL_FOLDER}/cancel-{self.request_id}.result.json"


class RowTracker:
    """Every row's status while the sweep runs (ids from the dataset's first pass)."""

    def __init__(self, ids: list[str]):
        self.statuses: dict[str, LiveStatus] = dict.fromkeys(ids, "queued")
        self.cancelled_ids: set[str] = set()
        self.version = 0

    def set(self, row_id: str, status: LiveStatus) -> None:
        if self.statuses.get(row_id) != status:
            self.statuses[row_id] = status
            self.version += 1

    def snapshot(self, state: str) -> bytes:
        counts = Counter(self.statuses.values())
        return json.dumps({"state": state, "counts": dict(counts), "rows": self.statuses}).encode()

    def apply(self, request: CancelRequest) -> tuple[dict[str, Disposition], list[str]]:
        """Dispositions for the request, and the running rows the caller must cancel."""
        if request.all:
            targets = list(self.statuses)
        else:
            targets = [i for i in request.ids] + [
                row_id for row_id in self.statuses for prefix in request.prefixes if row_id.startswith(prefix)
            ]
        dispositions: dict[str, Disposition] = {}
        running: list[str] = []
        for row_id in dict.fromkeys(targets):
            status = self.statuses.get(row_id)
            if status == "queued":
                dispositions[row_id] = "cancelled_queued"
                self.cancelled_ids.add(row_id)
            elif status in ("running", "grading"):
                dispositions[row_id] = "cancelled_running"
                self.cancelled_ids.add(row_id)
                running.append(row_id)
            else:
                dispositions[row_id] = "not_found"
        for prefix in request.prefixes:
            if not any(row_id.startswith(prefix) for row_id in dispositions):
                dispositions[f"{prefix}*"] = "not_found"
        return dispositions, running


def status_of(status_file: dict, row_id: str) -> LiveStatus:
    return status_file.get("rows", {}).get(row_id, "unknown")
