"""Live row status and partial cancellation, through the run's folder in storage.

A running sweep writes ``<run>/status.json`` (every row's status in the Osmosis
vocabulary) and reads cancellation requests that ``prefect-harbor cancel`` drops in
``<run>/control/``; it answers each with a ``.result.json`` of dispositions. The run's
folder is the channel because every process that can see the results can see it too --
on this machine or another, whatever launched the sweep. The sweep also keeps
``<run>/heartbeat.json`` fresh, so that a run whose process was killed is told from a live one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from prefect_harbor.sandbox.owners import owner_alive, owner_token
from prefect_harbor.storage.manifest import RunManifest
from prefect_harbor.storage.reading import DamagedFile
from prefect_harbor.storage.run_store import RunStore

LiveStatus = Literal["queued", "running", "grading", "success", "failure", "cancelled", "unknown"]
Disposition = Literal["cancelled_queued", "cancelled_running", "not_found"]
STATUS_FILE = "status.json"
CONTROL_FOLDER = "control"
HEARTBEAT_FILE = "heartbeat.json"
#: How often a running sweep rewrites its heartbeat: one small write, cheap next to a row's.
HEARTBEAT_SECONDS = 5.0
#: A run whose heartbeat is older than this is taken for dead. Twelve missed beats: a slow
#: storage write (retries take ~3.5 s), a short outage or clocks a little apart between machines
#: must not make a live run look dead (marking it Crashed is the worse mistake), while `status`
#: still says so within a minute. On the run's own host a dead process is known at once (its pid).
STALE_AFTER_SECONDS = 60.0


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


#: How a row's attempts read as one status: the first of these any attempt is in.
ROW_STATUS_ORDER: tuple[LiveStatus, ...] = ("running", "grading", "queued", "failure", "cancelled", "success")


class RowTracker:
    """Every row's status while the sweep runs, attempt by attempt (ids from the dataset's first pass).

    A row's own status is its attempts' (:data:`ROW_STATUS_ORDER`): running while any attempt
    runs, then queued while any waits, then failure if any failed, cancelled if any was, else
    success. With one attempt per row it is that attempt's."""

    def __init__(self, ids: list[str], attempts: int | dict[str, list[int]] = 1, host: str | None = None):
        """``attempts``: every row's count, or the attempts each row runs (a re-run of some attempts).
        ``host``: the machine this process runs rows on, recorded for each row that starts (a sweep
        on many hosts leaves it out: its shards say which host ran each row)."""
        self.host = host
        #: Which host ran each row that has started (the latest attempt's).
        self.hosts: dict[str, str] = {}
        self.attempts: dict[str, dict[int, LiveStatus]] = {}
        for row_id in ids:
            numbers = range(1, attempts + 1) if isinstance(attempts, int) else attempts.get(row_id, [1])
            self.attempts[row_id] = dict.fromkeys(numbers, "queued")
        self.cancelled_ids: set[str] = set()
        self.version = 0

    def set(self, row_id: str, status: LiveStatus, attempt: int = 1, host: str | None = None) -> None:
        """``host``: the machine that runs (or ran) it, when another process says so; else this tracker's own for a row under way."""
        statuses = self.attempts.setdefault(row_id, {})
        if statuses.get(attempt) != status:
            statuses[attempt] = status
            self.version += 1
        host = host or (self.host if status in ("running", "grading") else None)
        if host and self.hosts.get(row_id) != host:
            self.hosts[row_id] = host
            self.version += 1

    def forget_attempts_after(self, attempt: int) -> None:
        """Attempts past ``attempt`` will not run (the stopping rule ended the sweep): no longer tracked, nor shown queued."""
        for statuses in self.attempts.values():
            for number in [n for n in statuses if n > attempt]:
                del statuses[number]
        self.version += 1

    def status(self, row_id: str) -> LiveStatus:
        """The row's status, from its attempts'; ``unknown`` for an id the sweep has never seen."""
        present = set(self.attempts.get(row_id, {}).values())
        return next((status for status in ROW_STATUS_ORDER if status in present), "unknown")

    @property
    def finished(self) -> int:
        """How many attempts have their result (success, failure or cancelled)."""
        return sum(status in ("success", "failure", "cancelled") for statuses in self.attempts.values() for status in statuses.values())

    @property
    def several(self) -> bool:
        """Whether any row has attempts other than just its first."""
        return any(len(statuses) > 1 or 1 not in statuses for statuses in self.attempts.values())

    @property
    def statuses(self) -> dict[str, LiveStatus]:
        """Every row's status."""
        return {row_id: self.status(row_id) for row_id in self.attempts}

    def snapshot(self, state: str) -> bytes:
        """``status.json``: the counts of attempts by status, each row's status, with several
        attempts per row each attempt's (``attempts``: row id -> attempt -> status), and the host
        of each row that has started (``hosts``)."""
        counts = Counter(status for statuses in self.attempts.values() for status in statuses.values())
        document: dict = {"state": state, "counts": dict(counts), "rows": self.statuses}
        if self.several:
            document["attempts"] = self.attempts
        if self.hosts:
            document["hosts"] = self.hosts
        return json.dumps(document).encode()

    def apply(self, request: CancelRequest) -> tuple[dict[str, Disposition], list[str]]:
        """Dispositions for the request (a row's are its attempts'), and the rows with running attempts the caller must cancel."""
        if request.all:
            targets = list(self.attempts)
        else:
            targets = [i for i in request.ids] + [
                row_id for row_id in self.attempts for prefix in request.prefixes if row_id.startswith(prefix)
            ]
        dispositions: dict[str, Disposition] = {}
        running: list[str] = []
        for row_id in dict.fromkeys(targets):
            present = set(self.attempts.get(row_id, {}).values())
            if present & {"running", "grading"}:
                dispositions[row_id] = "cancelled_running"
                self.cancelled_ids.add(row_id)
                running.append(row_id)
            elif "queued" in present:
                dispositions[row_id] = "cancelled_queued"
                self.cancelled_ids.add(row_id)
            else:
                dispositions[row_id] = "not_found"
        for prefix in request.prefixes:
            if not any(row_id.startswith(prefix) for row_id in dispositions):
                dispositions[f"{prefix}*"] = "not_found"
        return dispositions, running


def status_of(status_file: dict, row_id: str) -> LiveStatus:
    return status_file.get("rows", {}).get(row_id, "unknown")


def attempts_of(status_file: dict, row_id: str) -> dict[str, LiveStatus]:
    """The row's attempts and their status (attempt number as text -> status), when rows have several."""
    return status_file.get("attempts", {}).get(row_id, {})


class Heartbeat(BaseModel):
    """``<run>/heartbeat.json``: when the sweep last said it was alive, and which process it is."""

    at: datetime
    host: str
    pid: int
    owner: str = Field(description="pid and start time (janitor.owner_token): a reused pid is not the owner.")
    flow_run_id: str | None = None

    @classmethod
    def now(cls, flow_run_id: str | None) -> Heartbeat:
        return cls(at=datetime.now(UTC), host=socket.gethostname(), pid=os.getpid(), owner=owner_token(), flow_run_id=flow_run_id)

    def stale(self) -> str | None:
        """Why the run is taken for dead, in words; None while it may be alive."""
        age = (datetime.now(UTC) - self.at).total_seconds()
        since = f"no heartbeat since {self.at:%Y-%m-%d %H:%M:%S} UTC ({age:.0f} s ago)"
        if self.host == socket.gethostname() and not owner_alive(self.owner):
            return f"{since}; its process {self.pid} on {self.host} is gone"
        if age > STALE_AFTER_SECONDS:
            return f"{since} from process {self.pid} on {self.host}"
        return None


class RunHealth(NamedTuple):
    manifest: RunManifest | None
    stale: str | None  # why a run whose manifest says Running (or Crashed) is dead, in words
    problems: list[str]  # damaged files, in words


def run_health(store: RunStore) -> RunHealth:
    """What the run folder says about the run beyond row statuses: its manifest, whether its
    process is gone, and what is damaged."""
    problems: list[str] = []
    try:
        manifest = store.read_manifest()
    except FileNotFoundError:
        manifest = None
    except DamagedFile as error:
        manifest = None
        problems.append(f"{error}: the run's state and configuration are unknown")
    try:
        beat = Heartbeat.model_validate_json(store.read_bytes(HEARTBEAT_FILE))
    except (FileNotFoundError, ValueError):  # a run of an older version, or one that never started
        beat = None
    state = manifest.state if manifest is not None else None  # None: unknown
    stale = beat.stale() if beat is not None and state in ("Running", "Crashed", None) else None
    return RunHealth(manifest, stale, problems)


class StaleRun(NamedTuple):
    store: RunStore
    manifest: RunManifest
    reason: str


def find_stale_runs(root: str, storage_options: dict | None = None) -> list[StaleRun]:
    """The runs under ``root`` whose manifest says Running but whose process is gone."""
    found = []
    for store in RunStore.runs_under(root, storage_options):
        health = run_health(store)
        if health.manifest is not None and health.manifest.state == "Running" and health.stale:
            found.append(StaleRun(store, health.manifest, health.stale))
    return found


class StatusReport(NamedTuple):
    """What ``prefect-harbor status`` shows of a run: from its status file, or rebuilt from its results."""

    state: str
    counts: dict[str, int]
    rows: dict[str, LiveStatus]
    attempts: dict[str, dict[str, LiveStatus]] | None  # when rows have several attempts
    stale: str | None
    problems: list[str]
    hosts: dict[str, str]  # row id -> the host that runs or ran it, for rows that have started


class NotStarted(LookupError):
    """The folder has no status file, no manifest and no heartbeat: not a sweep's run, or not started yet."""


def read_status(store: RunStore, ids: list[str] | None = None) -> StatusReport:
    """Every row's (or ``ids``') live status; a damaged or missing status file is rebuilt from the recorded results."""
    health = run_health(store)
    problems = list(health.problems)
    snapshot: dict | None
    try:
        snapshot = json.loads(store.read_bytes(STATUS_FILE))
    except FileNotFoundError:
        if health.manifest is None and not health.stale:
            raise NotStarted(store.uri(STATUS_FILE)) from None
        snapshot = None
    except ValueError as error:
        problems.append(f"{store.uri(STATUS_FILE)} is damaged ({error}): rows below are from the recorded results")
        snapshot = None
    if snapshot is None:
        store.logger = logging.getLogger("prefect_harbor.status")
        store.logger.disabled = True  # the report names what is damaged, once
        recorded = RowTracker([])
        for result in store.read_results():
            recorded.set(result.row_id, result.status, result.attempt, host=result.host)
        snapshot = {**json.loads(recorded.snapshot("unknown")), "state": "unknown"}
        problems += store.damaged
    state = health.manifest.state if health.manifest is not None else snapshot["state"]
    rows = {row_id: status_of(snapshot, row_id) for row_id in ids} if ids else snapshot["rows"]
    attempts = {row_id: attempts_of(snapshot, row_id) for row_id in rows} if "attempts" in snapshot else None
    hosts = {row_id: host for row_id, host in snapshot.get("hosts", {}).items() if row_id in rows}
    return StatusReport(state, snapshot["counts"], rows, attempts, health.stale, problems, hosts)


class NotCancellable(RuntimeError):
    """The run is not running: ``stale`` (its process is gone) or ``ended`` (the manifest's final state)."""

    def __init__(self, stale: str | None = None, ended: str | None = None) -> None:
        super().__init__(stale or ended)
        self.stale, self.ended = stale, ended


def send_cancel(store: RunStore, request: CancelRequest, timeout: float, poll: float = 0.3) -> dict[str, Disposition]:
    """Drop ``request`` in the run's control folder and wait for the sweep's dispositions.

    Raises :class:`NotCancellable` for a run that is not running and ``TimeoutError`` when the
    sweep has not answered within ``timeout`` seconds."""
    health = run_health(store)
    if health.stale:
        raise NotCancellable(stale=health.stale)
    if health.manifest is not None and health.manifest.state != "Running":
        raise NotCancellable(ended=health.manifest.state)
    store.write_bytes(request.path, request.model_dump_json().encode())
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(store.read_bytes(request.result_path))
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to {store.uri(request.path)} within {timeout:g} s") from None
            time.sleep(poll)
