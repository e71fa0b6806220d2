"""podman's REST service, one per process, for the calls a trial makes many times.

A podman CLI call costs 60-70 ms of CPU before it does anything (it loads its configuration
and reads the whole image store); the same exec through ``podman system service`` costs the
service about 13 ms, an inspect 2 ms. A trial makes a dozen such calls, so the ones it makes
often (exec, copies, inspect, diff, remove) go to a service this process starts on first use:

- its socket is in a folder of its own that only root can open (``mkdtemp``), so no other
  user, and no container (which sees none of the host's files), can reach it;
- it runs in a session of its own, so a Ctrl-C to the terminal's process group leaves it to
  the cancellation that still needs it; this process stops it at exit, and one left behind by a
  process that was killed exits by itself after :data:`IDLE_EXIT_SEC` without a request (the
  janitor removes such a process's folder: it is named by its owner);
- it runs with :func:`~prefect_harbor.sandbox.engine.engine_env`, as every CLI call does, and
  shares the CLI's storage: a container ``podman run`` started is the service's to exec in.

A service that has gone (idle, killed) is started again by the next call that finds it gone.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC, EngineError, engine_env, podman_argv
from prefect_harbor.sandbox.owners import owner_token

#: A service no process has called for this long exits (one whose process died, in practice):
#: an exec or a copy under way keeps it, as its connection is open.
IDLE_EXIT_SEC = 120
#: How long a starting service may take to answer (podman loads its storage first; a busy host is slow).
START_TIMEOUT_SEC = 60.0
#: The API version the calls are written against (podman 4.3, Debian 12; podman 5 serves it too).
#: Paths under it are libpod's own (``/libpod/...``) or Docker's (``/containers/...``).
API_ROOT = "http://podman/v4.0.0"
#: A service's folder: this, its owner's token, a random part.
FOLDER_PREFIX = "prefect-harbor-engine-"
#: The longest path a unix socket can have (``sun_path``, less its NUL), and what the folder and socket names add.
_MAX_SOCKET_PATH = 107
_SOCKET_NAME_BYTES = len("/prefect-harbor-engine-4194304.999999999999-12345678/podman.sock")
#: Connections tried before a call fails.
_CONNECT_TRIES = 3


class _Service:
    """The service process of this process, started when first needed and again if it has gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._folder: Path | None = None
        #: The socket once the service has answered on it (unset while one starts).
        self._ready: Path | None = None

    def running(self) -> Path | None:
        """The socket of the service if it runs (no start, no lock: the event loop's fast path)."""
        process, ready = self._process, self._ready
        return ready if process is not None and ready is not None and process.poll() is None else None

    def socket(self) -> Path:
        """The socket of a running service (started, or started again, here)."""
        with self._lock:
            if self.running() is None:
                self._start()
            assert self._ready is not None  # set by _start
            return self._ready

    def stop(self) -> None:
        with self._lock:
            self._ready = None
            if self._process is not None:
                _stop(self._process)
                self._process = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    def forget(self) -> None:
        """In a forked child: the parent's service is the parent's; the child starts its own."""
        self._lock = threading.Lock()
        self._process, self._folder, self._ready = None, None, None

    def _start(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        # Named by its owner (mode 0700: root only): the janitor removes the folders of owners that died.
        self._folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{owner_token()}-", dir=socket_parent()))
        socket, log = self._folder / "podman.sock", self._folder / "service.log"
        argv = podman_argv("system", "service", "--time", str(IDLE_EXIT_SEC), f"unix://{socket}")
        # Its output goes to a file: a pipe nobody reads would stop it, and a closed one kill it (SIGPIPE).
        with log.open("wb") as output:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=engine_env(), start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_SEC
        while not _answers(socket):
            if self._process.poll() is not None:
                detail = log.read_text(errors="replace").strip()
                raise EngineError(f"podman's service did not start (exit {self._process.returncode}): {detail[-2000:]}")
            if time.monotonic() > deadline:
                _stop(self._process)
                raise EngineError(f"podman's service did not answer on {socket} within {START_TIMEOUT_SEC:g} s")
            time.sleep(0.02)
        self._ready = socket


def socket_parent() -> str:
    """The temporary folder, unless its path is too long for a socket in it (a socket's path holds at
    most 107 bytes, and a test's or a job's ``TMPDIR`` can be longer): then ``/tmp``."""
    parent = tempfile.gettempdir()
    return parent if len(os.fsencode(parent)) <= _MAX_SOCKET_PATH - _SOCKET_NAME_BYTES else "/tmp"


def _answers(socket: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket), verify=False), trust_env=False) as client:
            return client.get(f"{API_ROOT}/libpod/_ping", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_SERVICE = _Service()
atexit.register(_SERVICE.stop)
os.register_at_fork(after_in_child=_SERVICE.forget)


def segment(name: str) -> str:
    """``name`` (a container, an image reference, an exec id) as one path segment of a call: a task's
    image reference is the task author's text, and ``x/../../_ping?`` must not name another endpoint."""
    return quote(name, safe="")


def _client(socket: Path, timeout: float | None) -> httpx.AsyncClient:
    # trust_env=False: a host proxy setting must not route a local socket's requests (nor load CA files).
    transport = httpx.AsyncHTTPTransport(uds=str(socket), verify=False)
    return httpx.AsyncClient(transport=transport, base_url=API_ROOT, trust_env=False, timeout=timeout)


@contextlib.asynccontextmanager
async def engine_stream(
    method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None, content: Any = None,
    headers: Mapping[str, str] | None = None, timeout: float | None = None,
) -> AsyncIterator[httpx.Response]:  # fmt: skip
    """One request to the service, its response open for reading as it comes.

    A request the service never received (it had gone, or was too busy to accept) is sent again."""
    for attempt in range(1, _CONNECT_TRIES + 1):
        socket = _SERVICE.running()
        if socket is None:
            socket = await asyncio.to_thread(_SERVICE.socket)
        async with _client(socket, timeout) as client:
            try:
                request = client.build_request(method, path, params=params, json=json, content=content, headers=headers)
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, FileNotFoundError):
                if attempt == _CONNECT_TRIES:
                    raise
                await asyncio.sleep(0.2)  # the service is exiting (idle) or busy accepting: ask again, a new one if it has gone
                continue
            try:
                yield response
            finally:
                await response.aclose()
            return


async def engine_call(
    method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None, content: Any = None,
    headers: Mapping[str, str] | None = None, timeout: float | None = None,
) -> httpx.Response:  # fmt: skip
    """One request to the service, its response read whole."""
    async with engine_stream(method, path, params=params, json=json, content=content, headers=headers, timeout=timeout) as response:
        await response.aread()
        return response


def engine_error(response: httpx.Response, what: str) -> EngineError:
    """The service's refusal of ``what``, in its own words (its error body is ``{"message": ...}``)."""
    try:
        detail = response.json().get("message", response.text)
    except ValueError:
        detail = response.text
    return EngineError(f"{what} failed (podman service, HTTP {response.status_code}): {str(detail).strip()[-2000:]}")


async def remove_container(container: str) -> str | None:
    """``podman rm --force --time 0 CONTAINER`` through the service: None once it is gone (or was
    never there), else the engine's reason it is not."""
    removed = await engine_call("DELETE", f"/libpod/containers/{segment(container)}", params={"force": "true", "timeout": "0"}, timeout=STATE_CALL_TIMEOUT_SEC)
    if removed.status_code in (200, 204, 404):
        failed = [report.get("Err") for report in removed.json() if isinstance(report, dict) and report.get("Err")] if removed.status_code == 200 else []
        return "; ".join(map(str, failed)) or None
    return str(engine_error(removed, f"removing container {container}"))


def reap_orphaned_folders(owner_alive: Callable[[str], bool]) -> list[Path]:
    """Remove the service folders whose owner process is gone (a process killed before its exit
    handler ran leaves one; its service has exited by then, or exits when idle); the folders removed."""
    removed = []
    for parent in {Path(tempfile.gettempdir()), Path("/tmp")}:  # where socket_parent() puts them
        for folder in parent.glob(f"{FOLDER_PREFIX}*"):
            owner = folder.name.removeprefix(FOLDER_PREFIX).rpartition("-")[0]
            if folder.is_dir() and not folder.is_symlink() and owner and not owner_alive(owner):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed
