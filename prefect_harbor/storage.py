"""One sweep run's folder in object storage, written so that nothing finished is lost.

Layout under the results root (a local path or any fsspec URL)::

    <root>/<run_id>/manifest.json              configuration (secrets redacted), versions,
                                               dataset fingerprint, start/end, final state
    <root>/<run_id>/parts/part-000042.parquet  one file per finished row, written at once
    <root>/<run_id>/results.parquet            all rows, compacted when the run ends
    <root>/<run_id>/archives/<row>/...         per-row logs, artifacts, diagnostics
    <root>/<run_id>/status.json, heartbeat.json live row statuses, the sweep's last sign of life (control.py)

Every write is whole or absent: a local file is written under a temporary name and
renamed, an object is put in one request, so a crash never leaves a file cut short.
Every write is retried; if the storage stays down the file is kept under a local
fallback folder instead, the run keeps going, and the manifest, the logs and the
summary say exactly where those files are. At the end they are pushed once more.
Reading survives files damaged anyway (by an older version, or by hand): a damaged part
is named in a warning and its rows count as not finished.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, ValidationError

from prefect_harbor.config import ConfigurationError
from prefect_harbor.results import RESULTS_SCHEMA, RowResult, to_table

T = TypeVar("T")
VERSIONED_PACKAGES = ("prefect-harbor", "prefect", "harbor", "pyarrow", "fsspec", "s3fs", "pydantic")
#: Seconds to wait before each retry of a failed write (so 4 attempts in about 3.5 s).
RETRY_DELAYS = (0.5, 1.0, 2.0)
#: Rows gathered in memory before they are appended to the local spool as one record batch
#: (compacting 10,000 rows written one batch per row took +218 MB at its peak; 256 per batch, +37 MB).
SPOOL_BATCH = 256
#: After a write failed for good, how long later writes make a single attempt.
OUTAGE_BACKOFF_SEC = 30.0


class StorageUnavailable(OSError):
    """The results storage refused a write even after retries."""


class DamagedFile(ValueError):
    """A file of the run folder cannot be parsed: most likely cut short by a crash."""


class RunManifest(BaseModel):
    run_id: str
    flow_run_id: str | None = None
    state: str = Field(description="Running, Completed, Cancelled, Failed or Crashed.")
    started_at: datetime
    finished_at: datetime | None = None
    dataset: dict[str, Any]
    configuration: dict[str, Any] = Field(description="The backend configuration, secrets redacted.")
    backend_block: str | None = Field(default=None, description="The Harbor Backend block the configuration came from, if any.")
    versions: dict[str, str]
    results_uri: str | None = None
    rows_written: int = 0
    local_fallback: str | None = Field(default=None, description="Where files the storage refused are kept.")
    resumed: int = Field(default=0, description="How many times this run was resumed.")
    rerun_of: str | None = Field(default=None, description="The run whose failed and cancelled rows this run re-runs.")
    unsent_files: list[str] = Field(default_factory=list)


def package_versions() -> dict[str, str]:
    """The installed versions of the packages a run's results depend on (a fresh dict each call)."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    """Read once per process: each lookup parses a package's metadata (~5 ms; a prewarm asks per task)."""
    found = []
    for name in VERSIONED_PACKAGES:
        try:
            found.append((name, version(name)))
        except PackageNotFoundError:
            pass
    return tuple(found)


class RunStore:
    """Reads and writes one run's folder; see the module docstring for the layout."""

    def __init__(
        self,
        root: str,
        run_id: str,
        fallback_dir: Path,
        storage_options: dict[str, Any] | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
    ):
        self.fs, root_path = fsspec.core.url_to_fs(root, **_with_short_client_retries(root, storage_options or {}))
        self.run_path = f"{root_path.rstrip('/')}/{run_id}"
        self.run_id = run_id
        self.fallback_dir = fallback_dir
        if hasattr(self.fs, "retries"):
            self.fs.retries = 1  # s3fs's own retry loop (default 5), on our private instance
        self.logger = logger or logging.getLogger(__name__)
        self.retry_delays = retry_delays
        self.unsent: list[str] = []
        #: What reading found damaged, in words (``status`` prints it).
        self.damaged: list[str] = []
        self._down_since: float | None = None
        #: Every row this store wrote, appended to a local Arrow stream: ``finalize`` compacts the
        #: results table from it, so the flow need not keep its rows in memory.
        self.spool_path = fallback_dir.with_name(f"{fallback_dir.name}-rows.arrows")
        self._spool: pa.ipc.RecordBatchStreamWriter | None = None
        self._spool_pending: list[pa.Table] = []  # rows not yet in the spool: it is written SPOOL_BATCH rows at a time
        self._spool_lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Shipped to another process (a Dask worker) without the flow run's logger and spool."""
        return {**self.__dict__, "logger": logging.getLogger(__name__), "_spool": None, "_spool_pending": [], "_spool_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _spool_lock=threading.Lock())

    def uri(self, relative: str = "") -> str:
        return self.fs.unstrip_protocol(f"{self.run_path}/{relative}".rstrip("/"))

    # ---------------------------------------------------------------- writes

    def check_writable(self) -> None:
        """Write, read back and delete a probe: wrong credentials fail here, before any trial."""
        probe = f"{self.run_path}/.write-check"
        try:
            self.fs.makedirs(self.run_path, exist_ok=True)
            self.fs.pipe_file(probe, b"ok")
            if self.fs.cat_file(probe) != b"ok":
                raise OSError("read back different bytes")
            self.fs.rm_file(probe)
        except Exception as error:  # s3fs raises PermissionError, OSError, ClientError...
            raise ConfigurationError(
                f"results storage {self.uri()} is not writable ({type(error).__name__}: {error}); "
                "check the URL, the credentials and the endpoint (Results Storage block or --results)."
            ) from error

    def write_bytes(self, relative: str, content: bytes) -> str:
        """Write ``content`` at ``<run>/<relative>``; on lasting failure keep it locally."""
        return self._write(relative, lambda path: self._put(path, content), lambda local: local.write_bytes(content))

    def write_file(self, relative: str, source: Path) -> str:
        """Copy the local file ``source`` to ``<run>/<relative>``, streamed (never read whole)."""
        return self._write(relative, lambda path: self._put_file(path, source), lambda local: shutil.copyfile(source, local))

    def _write(self, relative: str, put: Callable[[str], None], keep_locally: Callable[[Path], object]) -> str:
        """Run ``put`` with retries; on lasting failure ``keep_locally`` under the fallback folder.

        After a write has failed for good, later writes get a single attempt for
        ``OUTAGE_BACKOFF_SEC``: an outage costs each row seconds, not a retry cycle per file.
        """
        path = f"{self.run_path}/{relative}"
        in_outage = self._down_since is not None and time.monotonic() - self._down_since < OUTAGE_BACKOFF_SEC
        try:
            self._retry(lambda: put(path), f"write {relative}", delays=() if in_outage else self.retry_delays)
            self._down_since = None
            return self.fs.unstrip_protocol(path)
        except StorageUnavailable as error:
            self._down_since = time.monotonic()
            local = self.fallback_dir / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            keep_locally(local)
            self.unsent.append(relative)
            self.logger.error(f"Results storage unavailable ({error}); kept {relative} locally at {local}")
            return str(local)

    def write_now(self, relative: str, content: bytes) -> None:
        """One attempt, never kept locally: for files only worth having now (the heartbeat)."""
        self._put(f"{self.run_path}/{relative}", content)

    def _put(self, path: str, content: bytes) -> None:
        self._whole(path, lambda target: self.fs.pipe_file(target, content))

    def _put_file(self, path: str, source: Path) -> None:
        self._whole(path, lambda target: self.fs.put_file(str(source), target))

    def _whole(self, path: str, write: Callable[[str], object]) -> None:
        """Write ``path`` whole or not at all: an object store puts it in one request; a local
        file is written under a hidden temporary name (which Parquet readers skip) and renamed."""
        if not isinstance(self.fs, LocalFileSystem):
            write(path)  # object stores need no folders: one request (s3fs streams big files in parts)
            return
        folder, _, name = path.rpartition("/")
        temporary = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        self.fs.makedirs(folder, exist_ok=True)
        try:
            write(temporary)
            self.fs.mv(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.rm_file(temporary)
            raise

    def _retry(self, operation: Callable[[], T], what: str, delays: tuple[float, ...] | None = None) -> T:
        for attempt, delay in enumerate((*(self.retry_delays if delays is None else delays), None), start=1):
            try:
                return operation()
            except FileNotFoundError:
                raise
            except Exception as error:
                if delay is None:
                    raise StorageUnavailable(f"{what} failed {attempt} times; last: {type(error).__name__}: {error}") from error
                self.logger.warning(f"Storage {what} failed ({type(error).__name__}: {error}); retrying in {delay:g} s")
                time.sleep(delay)
        raise AssertionError("unreachable")

    def write_manifest(self, manifest: RunManifest) -> str:
        manifest.local_fallback = str(self.fallback_dir) if self.unsent else None
        manifest.unsent_files = list(self.unsent)
        return self.write_bytes("manifest.json", manifest.model_dump_json(indent=2).encode())

    def write_row(self, result: RowResult) -> str:
        """Persist one finished row at once, so a crash later loses nothing."""
        return self.write_rows([result])

    def write_rows(self, results: list[RowResult]) -> str:
        """Persist finished rows as one part, named by the row indexes it holds."""
        first, last = results[0].row_index, results[-1].row_index
        name = f"part-{first:06d}" if first == last else f"part-{first:06d}-{last:06d}"
        table = to_table(results)
        with self._spool_lock:
            self._spool_pending.append(table)
            if sum(pending.num_rows for pending in self._spool_pending) >= SPOOL_BATCH:
                self._flush_spool()
        return self.write_bytes(f"parts/{name}.parquet", _parquet_bytes(table))

    def _flush_spool(self) -> None:
        """Append the pending rows to the spool as one record batch (call with the lock held)."""
        if not self._spool_pending:
            return
        if self._spool is None:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            self._spool = pa.ipc.new_stream(str(self.spool_path), RESULTS_SCHEMA)
        self._spool.write_table(pa.concat_tables(self._spool_pending).combine_chunks())
        self._spool_pending = []

    def read_bytes(self, relative: str) -> bytes:
        return self.fs.cat_file(f"{self.run_path}/{relative}")

    def list_names(self, folder: str) -> list[str]:
        """File names directly under ``<run>/<folder>`` (none when it does not exist)."""
        try:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.run_path}/{folder}", detail=False, refresh=True))
        except FileNotFoundError:
            return []

    @classmethod
    def open(cls, run_url: str, storage_options: dict[str, Any] | None = None) -> RunStore:
        """The store of an existing run folder, e.g. ``results/20261129T181500Z-1a2b3c4d``."""
        root, run_id = split_run_folder(run_url)
        return cls(root, run_id, fallback_dir=Path(tempfile.gettempdir()) / "prefect-harbor" / "unsent" / run_id, storage_options=storage_options)

    @classmethod
    def runs_under(cls, root: str, storage_options: dict[str, Any] | None = None) -> list[RunStore]:
        """A store for each run folder under ``root``, all on one connection: for reads and ``write_now``."""
        anchor = cls.open(f"{root.rstrip('/')}/_", storage_options)
        root_path = anchor.run_path.rpartition("/")[0]
        try:
            entries = anchor.fs.ls(root_path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        stores = []
        for entry in entries:
            if entry["type"] == "directory":
                store = copy.copy(anchor)
                store.run_id = entry["name"].rstrip("/").rsplit("/", 1)[-1]
                store.run_path, store.unsent, store.damaged = f"{root_path}/{store.run_id}", [], []
                stores.append(store)
        return stores

    def read_results(self) -> list[RowResult]:
        """Every row already recorded: from ``results.parquet``, else from the parts. A damaged
        file is named in a warning (and in ``damaged``); its rows count as not recorded."""
        table = self._read_parquet("results.parquet") if self.fs.exists(f"{self.run_path}/results.parquet") else None
        if table is None:
            table = self._read_parts()
        return [RowResult.model_validate({**r, "rewards": dict(r["rewards"] or [])}) for r in table.to_pylist()]

    def _read_parts(self) -> pa.Table:
        try:
            return pq.read_table(f"{self.run_path}/parts", filesystem=self.fs)  # one read of them all, the usual case
        except FileNotFoundError:
            return RESULTS_SCHEMA.empty_table()
        except (pa.ArrowException, OSError):
            pass  # a part is damaged: read them one by one to keep the others
        tables = [self._read_parquet(f"parts/{name}") for name in self.list_names("parts") if not name.startswith((".", "_"))]
        return pa.concat_tables([t for t in tables if t is not None] or [RESULTS_SCHEMA.empty_table()], promote_options="default")

    def _read_parquet(self, relative: str) -> pa.Table | None:
        """The table in ``relative``, or None (with a warning) when it is damaged."""
        try:
            return pq.read_table(f"{self.run_path}/{relative}", filesystem=self.fs)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as error:
            problem = f"{self.uri(relative)} is damaged ({type(error).__name__}: {error}), probably cut short by a crash"
            self.damaged.append(problem)
            self.logger.warning(f"{problem}: its rows are treated as not finished (a --resume runs them again)")
            return None

    def read_manifest(self) -> RunManifest:
        """The run's manifest; ``DamagedFile`` when it cannot be parsed, ``FileNotFoundError`` when absent."""
        content = self.read_bytes("manifest.json")
        try:
            return RunManifest.model_validate_json(content)
        except ValidationError as error:
            detail = error.errors()[0]["msg"]
            raise DamagedFile(f"{self.uri('manifest.json')} is damaged ({len(content)} bytes: {detail}), probably cut short by a crash") from None

    def restart_from(self, kept: list[RowResult]) -> None:
        """Drop the recorded rows a resumed run will redo (and old control requests, already
        answered); keep ``kept`` as one part."""
        for relative in ("results.parquet", "parts", "control"):
            if self.fs.exists(f"{self.run_path}/{relative}"):
                self.fs.rm(f"{self.run_path}/{relative}", recursive=True)
        if kept:
            self.write_rows(sorted(kept, key=lambda r: r.row_index))

    # ---------------------------------------------------------------- end of run

    def push_unsent(self) -> None:
        """Try once more (with retries) to move locally kept files to the storage."""
        still: list[str] = []
        for relative in self.unsent:
            if still:  # the storage is still down: keep the rest without another retry cycle each
                still.append(relative)
                continue
            local = self.fallback_dir / relative
            try:
                self._retry(lambda: self._put(f"{self.run_path}/{relative}", local.read_bytes()), f"push {relative}")
            except StorageUnavailable:
                still.append(relative)
            else:
                local.unlink()
        self.unsent = still
        if still:
            self._down_since = time.monotonic()

    def finalize(self) -> str:
        """Write every row this store wrote into ``results.parquet``, in row order, then drop the
        parts it replaces. Holds the rows in columnar form only for this step."""
        self.push_unsent()
        with self._spool_lock:
            self._flush_spool()
            if self._spool is not None:
                self._spool.close()
                self._spool = None
            rows = pa.ipc.open_stream(str(self.spool_path)).read_all() if self.spool_path.exists() else RESULTS_SCHEMA.empty_table()
        location = self.write_bytes("results.parquet", _parquet_bytes(rows.sort_by("row_index")))
        self.spool_path.unlink(missing_ok=True)
        if "results.parquet" not in self.unsent:
            try:
                self._retry(lambda: self.fs.rm(f"{self.run_path}/parts", recursive=True), "remove parts")
            except (StorageUnavailable, FileNotFoundError):
                self.logger.warning(f"Could not remove {self.uri('parts')}; results.parquet holds every row")
        return location


def run_folder_of_flow_run(root: str, flow_run_id: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """The run folder under ``root`` that flow run ``flow_run_id`` wrote (its run id ends with the
    id's first 8 characters; its manifest names it), or None: how a Retry finds its own run."""
    fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
    for folder in sorted(fs.glob(f"{path.rstrip('/')}/*-{flow_run_id[:8]}")):
        try:
            manifest = RunManifest.model_validate_json(fs.cat_file(f"{folder}/manifest.json"))
        except (OSError, ValueError):
            continue
        if manifest.flow_run_id == flow_run_id:
            return fs.unstrip_protocol(folder) if "://" in root else folder
    return None


def split_run_folder(run_folder: str) -> tuple[str, str]:
    """``<root>/<run_id>`` split into its results root and run id."""
    root, _, run_id = run_folder.rstrip("/").rpartition("/")
    return root or ".", run_id


def _with_short_client_retries(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """This class retries every write itself; keep the S3 client's own retries short, so a
    storage outage costs seconds per write, not minutes (botocore x s3fs retries multiply)."""
    if not url.startswith(("s3://", "s3a://")):
        return options
    config = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 1, "mode": "standard"}}
    return {**options, "config_kwargs": {**config, **options.get("config_kwargs", {})}, "skip_instance_cache": True}


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def now() -> datetime:
    return datetime.now(UTC)
