"""Commands in a trial's containers: one ``podman exec`` each, its output read as it comes.

Each exec runs with a marker variable of its own, which every process it starts inherits: on a
timeout or a cancellation, those processes are found in the container's ``/proc`` by that
marker and killed, so nothing an exec started outlives it (killing the host's ``podman exec``
alone would leave them running).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import secrets
import subprocess
from collections.abc import Callable, Mapping

from harbor.environments.base import ExecResult, OutputCallback, OutputStream

from prefect_harbor.sandbox.engine import env_file_options, podman, start_podman
from prefect_harbor.sandbox.spawn import EngineProcess
from prefect_harbor.sandbox.verifier_watch import VerifierWatch

EXEC_MARKER = "PREFECT_HARBOR_EXEC"
_READ_CHUNK = 64 * 1024


async def exec_in(
    container: str, argv: list[str], *, workdir: str | None, variables: Mapping[str, str], timeout_sec: int | None, user: str | int | None,
    output: OutputCallback | None = None, watch: VerifierWatch | None = None, running: Callable[[str], bool],
) -> ExecResult:  # fmt: skip
    """``podman exec`` of ``argv`` in ``container``; on timeout or cancellation every process it
    started is killed (inside the container while ``running`` says it still runs).

    ``output`` gets the output as it comes; ``watch`` (main's) times the exec while it watches a verification."""
    marker = f"{EXEC_MARKER}={secrets.token_hex(8)}"
    args = ["exec", "--env", marker]
    if user is not None:
        args += ["--user", str(user)]
    if workdir:
        args += ["--workdir", workdir]
    clock = await watch.exec_clock(marker) if watch is not None else None
    with env_file_options(variables) as env_args:
        process = await start_podman(*args, *env_args, container, *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            stdout, stderr = await asyncio.wait_for(_collect(process, output), timeout_sec)
        except TimeoutError:
            await asyncio.shield(_kill_exec(container, process, marker, inside=running(container)))
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        except asyncio.CancelledError:
            await asyncio.shield(_kill_exec(container, process, marker, inside=running(container)))
            raise
        finally:
            if clock is not None:
                assert watch is not None  # the clock is the watch's
                await asyncio.shield(watch.exec_returned(clock))
    return ExecResult(stdout=stdout, stderr=stderr, return_code=process.returncode or 0)


async def _collect(process: EngineProcess, callback: OutputCallback | None) -> tuple[str, str]:
    async def read(stream: asyncio.StreamReader | None, name: OutputStream) -> str:
        assert stream is not None, "started with stdout and stderr piped"
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: list[str] = []
        while chunk := await stream.read(_READ_CHUNK):
            text = decoder.decode(chunk)
            parts.append(text)
            if callback and text:
                await callback(text, name)
        parts.append(decoder.decode(b"", final=True))
        return "".join(parts)

    stdout, stderr = await asyncio.gather(read(process.stdout, "stdout"), read(process.stderr, "stderr"))
    await process.wait()
    return stdout, stderr


async def _kill_exec(container: str, process: EngineProcess, marker: str, *, inside: bool) -> None:
    """Kill every process the exec started: ``inside`` the container (they carry its marker), and the ``podman exec`` itself."""
    if inside:
        script = (
            f"for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
            f"grep -qx {marker} && kill -9 ${{p#/proc/}} 2>/dev/null; done; true"
        )
        with contextlib.suppress(Exception):
            await podman("exec", "--user", "root", container, "sh", "-c", script, timeout=30)
    if process.returncode is None:
        process.kill()
    with contextlib.suppress(Exception):
        await process.wait()
