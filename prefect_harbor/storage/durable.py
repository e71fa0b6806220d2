"""Writes to one run folder that are whole or absent, retried, and never lost.

A local file is written under a hidden temporary name and renamed; an object is put in one
request, so a crash never leaves a file cut short. Every write is retried; if the storage
stays down the file is kept under a local fallback folder instead, the run keeps going, and
:meth:`DurableFolder.push_unsent` tries those files again at the end.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from prefect_harbor.config import ConfigurationError

T = TypeVar("T")
#: Seconds to wait before each retry of a failed write (so 4 attempts in about 3.5 s).
RETRY_DELAYS = (0.5, 1.0, 2.0)
#: After a write failed for good, how long later writes make a single attempt.
OUTAGE_BACKOFF_SEC = 30.0


class StorageUnavailable(OSError):
    """The results storage refused a write even after retries."""


class DurableFolder:
    """One folder (``<root>/<run_id>``) on any fsspec filesystem, written as the module docstring says."""

    def __init__(
        self,
        root: str,
        run_id: str,
        fallback_dir: Path,
        storage_options: dict[str, Any] | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
    ):
        # A file system of its own, not fsspec's shared instance (as it always had on S3).
        self.fs, root_path = fsspec.core.url_to_fs(root, **{**short_client_retries(root, storage_options or {}), "skip_instance_cache": True})
        self.run_path = f"{root_path.rstrip('/')}/{run_id}"
        self.run_id = run_id
        self.fallback_dir = fallback_dir
        if hasattr(self.fs, "retries"):
            self.fs.retries = 1  # s3fs's own retry loop (default 5), on our private instance
        self.logger = logger or logging.getLogger(__name__)
        self.retry_delays = retry_delays
        self.unsent: list[str] = []
        self._down_since: float | None = None

    def uri(self, relative: str = "") -> str:
        return self.fs.unstrip_protocol(f"{self.run_path}/{relative}".rstrip("/"))

    def check_writable(self) -> None:
        """Write, read back and delete a probe: wrong credentials fail here, before any trial. The
        probe's name is this check's own: the shards of a sweep on many hosts check one folder at once."""
        probe = f"{self.run_path}/.write-check-{uuid.uuid4().hex[:12]}"
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

    # ---------------------------------------------------------------- writes

    def write_bytes(self, relative: str, content: bytes) -> str:
        """Write ``content`` at ``<run>/<relative>``; on lasting failure keep it locally."""
        return self._write(relative, lambda path: self._put(path, content), lambda local: local.write_bytes(content))

    def write_file(self, relative: str, source: Path) -> str:
        """Copy the local file ``source`` to ``<run>/<relative>``, streamed (never read whole)."""
        return self._write(relative, lambda path: self._put_file(path, source), lambda local: shutil.copyfile(source, local))

    def write_now(self, relative: str, content: bytes) -> None:
        """One attempt, never kept locally: for files only worth having now (the heartbeat)."""
        self._put(f"{self.run_path}/{relative}", content)

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
        temporary = f"{folder}/.{uuid.uuid4().hex}.tmp"  # not after the name: a name of 250 bytes has no room for more
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

    def push_unsent(self) -> None:
        """Try once more (with retries) to move locally kept files to the storage."""
        still: list[str] = []
        for relative in self.unsent:
            if still:  # the storage is still down: keep the rest without another retry cycle each
                still.append(relative)
                continue
            try:
                self._push(relative)
            except StorageUnavailable:
                still.append(relative)
        self.unsent = still
        if still:
            self._down_since = time.monotonic()

    def _push(self, relative: str) -> None:
        """One locally kept file to the storage (with retries), then removed here."""
        local = self.fallback_dir / relative
        self._retry(lambda: self._put(f"{self.run_path}/{relative}", local.read_bytes()), f"push {relative}")
        local.unlink()

    # ---------------------------------------------------------------- reads

    def read_bytes(self, relative: str) -> bytes:
        return self.fs.cat_file(f"{self.run_path}/{relative}")

    def list_names(self, folder: str) -> list[str]:
        """File names directly under ``<run>/<folder>`` (none when it does not exist)."""
        try:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.run_path}/{folder}", detail=False, refresh=True))
        except FileNotFoundError:
            return []


def short_client_retries(url: str, options: dict[str, Any], attempts: int = 1) -> dict[str, Any]:
    """``options`` with the S3 client's own retries kept to ``attempts`` tries (botocore's standard
    mode) and a 5 s connect timeout, so a storage outage costs seconds per call, not the half
    minute of botocore's defaults. This class retries every write itself, hence one try here."""
    if not url.startswith(("s3://", "s3a://")):
        return options
    config = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": attempts, "mode": "standard"}}
    return {**options, "config_kwargs": {**config, **options.get("config_kwargs", {})}}
