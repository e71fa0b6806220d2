"""The container engine: podman (and buildah under it), called as a daemonless CLI.

Every podman command line is built here (:func:`podman_argv`) and run with :func:`engine_env`,
which applies the project's own ``containers.conf`` and ``registries.conf`` (shipped beside
this module) through ``CONTAINERS_CONF``/``CONTAINERS_REGISTRIES_CONF``, so nothing under
``/etc`` is changed and a user's own podman set-up is left alone. :func:`podman` and
:func:`podman_sync` are for calls read whole, :func:`start_podman` for calls that stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from prefect_harbor.sandbox.spawn import EngineProcess, Stdio, start_engine_process

CONF_DIR = Path(__file__).parent
#: Label keys on every container this project starts (the janitor finds them by these).
LABEL_OWNER = "io.prefect-harbor.owner"
LABEL_TRIAL = "io.prefect-harbor.trial"
#: The compose service a container runs (``main`` for the trial's own container).
LABEL_SERVICE = "io.prefect-harbor.service"
#: The deadline of a podman call that only changes or reads engine state (create, cp, start,
#: stop, rm, inspect). It catches a hung engine, not a busy one: on a loaded host such a call
#: can wait minutes for the storage lock while another process loads or commits an image.
STATE_CALL_TIMEOUT_SEC = 600.0


class EngineError(RuntimeError):
    """A podman call failed; the message carries the command and podman's own words."""


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace").strip()

    def check(self, what: str) -> Completed:
        if self.returncode != 0:
            detail = (self.stderr or self.stdout).decode(errors="replace").strip()
            raise EngineError(f"{what} failed (podman exit {self.returncode}): {detail[-2000:]}")
        return self


@cache
def podman_path() -> str:
    found = shutil.which("podman")
    if found is None:
        raise EngineError(
            "podman is not installed: the container sandbox needs podman, buildah and runc "
            "(Debian/Ubuntu: apt-get install podman buildah runc tini; or run `bash scripts/dev.sh setup`)."
        )
    return found


def engine_env() -> dict[str, str]:
    """The environment podman runs with: the host's, plus the project's engine settings.

    It is podman's own environment (proxies and the like reach the engine), never a
    container's: containers get only what :mod:`prefect_harbor.sandbox.container` passes.
    """
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONF_DIR / "containers.conf"))
    env.setdefault("CONTAINERS_REGISTRIES_CONF", str(CONF_DIR / "registries.conf"))
    return env


def podman_argv(*args: str) -> list[str]:
    """The command line of ``podman ARGS``."""
    return [podman_path(), *args]


async def start_podman(*args: str, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> EngineProcess:
    """``podman ARGS`` started off the event loop (:mod:`.spawn`), for a call whose streams the caller reads or feeds."""
    return await start_engine_process(podman_argv(*args), stdin=stdin, stdout=stdout, stderr=stderr, env=engine_env())


async def podman(*args: str, stdin: bytes | None = None, timeout: float | None = None) -> Completed:
    """Run ``podman ARGS`` and collect its output; on timeout the call is killed and raises."""
    process = await start_podman(*args, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(stdin), timeout)
    except (TimeoutError, asyncio.CancelledError) as stopped:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if isinstance(stopped, TimeoutError):  # asyncio's says nothing: name the call that took too long
            raise TimeoutError(f"podman {' '.join(args[:2])} did not finish within {timeout:g} s") from None
        raise
    return Completed(process.returncode or 0, stdout, stderr)


def podman_sync(*args: str, stdin: Stdio = None, timeout: float | None = 60) -> Completed:
    """:func:`podman` for code outside an event loop (CLI commands, the janitor)."""
    done = subprocess.run(podman_argv(*args), stdin=stdin, capture_output=True, timeout=timeout, env=engine_env())
    return Completed(done.returncode, done.stdout, done.stderr)


@contextlib.contextmanager
def env_file_options(variables: Mapping[str, str]) -> Iterator[list[str]]:
    """``--env-file`` options for ``variables``: values never appear on a host command line."""
    if not variables:
        yield []
        return
    bad = [k for k, v in variables.items() if "\n" in str(v) or "\n" in k]
    if bad:
        raise ValueError(f"environment variables {bad} hold a newline, which podman's env files cannot carry.")
    with tempfile.NamedTemporaryFile("w", prefix="prefect-harbor-env-", delete=True) as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write("".join(f"{key}={value}\n" for key, value in variables.items()))
        handle.flush()
        yield ["--env-file", handle.name]
