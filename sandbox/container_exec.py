"""Commands in a trial's containers: one exec each through podman's service, its output read as it comes.

Each exec runs with a marker variable of its own, which every process it starts inherits: on a
timeout or a cancellation, those processes are found in the container's ``/proc`` by that
marker and killed, so nothing an exec started outlives it (ending the exec's stream alone
would leave them running).

An exec the engine refuses (the container has stopped, the program does not exist) returns
what ``podman exec`` would: exit status 125 to 127 and the engine's words on stderr.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import secrets
import struct
from collections.abc import Callable, Mapping

from harbor.environments.base import ExecResult, OutputCallback, OutputStream

from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC
from prefect_harbor.sandbox.engine_service import engine_call, engine_error, engine_stream, segment
from prefect_harbor.sandbox.verifier_watch import VerifierWatch

EXEC_MARKER = "PREFECT_HARBOR_EXEC"
#: podman exec's own status when the engine, not the command, failed.
ENGINE_FAILED = 125
#: A frame of the service's output stream: 1 byte stream (1 stdout, 2 stderr), 3 padding, 4 length.
_FRAME_HEADER = struct.Struct(">B3xI")
_STREAMS: dict[int, OutputStream] = {1: "stdout", 2: "stderr"}
#: How long the service may take to report an exit after the output ended.
_EXIT_REPORT_SEC = 30.0


async def exec_in(
    container: str, argv: list[str], *, workdir: str | None, variables: Mapping[str, str], timeout_sec: int | None, user: str | int | None,
    output: OutputCallback | None = None, watch: VerifierWatch | None = None, running: Callable[[str], bool],
) -> ExecResult:  # fmt: skip
    """``argv`` run in ``container``; on timeout or cancellation every process it started is
    killed (inside the container while ``running`` says it still runs).

    ``output`` gets the output as it comes; ``watch`` (main's) times the exec while it watches a verification."""
    marker = f"{EXEC_MARKER}={secrets.token_hex(8)}"
    session = {
        "Cmd": argv, "Env": [*(f"{key}={value}" for key, value in variables.items()), marker],
        "AttachStdout": True, "AttachStderr": True, "AttachStdin": False, "Tty": False,
    }  # fmt: skip
    if user is not None:
        session["User"] = str(user)
    if workdir:
        session["WorkingDir"] = workdir
    created = await engine_call("POST", f"/libpod/containers/{segment(container)}/exec", json=session, timeout=STATE_CALL_TIMEOUT_SEC)
    if created.status_code != 201:
        return ExecResult(stdout="", stderr=f"Error: {engine_error(created, 'exec')}", return_code=ENGINE_FAILED)
    exec_id = created.json()["Id"]
    clock = await watch.exec_clock(marker) if watch is not None else None
    try:
        stdout, stderr = await asyncio.wait_for(_attach(exec_id, output), timeout_sec)
    except TimeoutError:
        await asyncio.shield(_kill_exec(container, marker, inside=running(container)))
        raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
    except asyncio.CancelledError:
        await asyncio.shield(_kill_exec(container, marker, inside=running(container)))
        raise
    finally:
        if clock is not None:
            assert watch is not None  # the clock is the watch's
            await asyncio.shield(watch.exec_returned(clock))
    return ExecResult(stdout=stdout, stderr=stderr, return_code=await _exit_code(exec_id))


async def _attach(exec_id: str, callback: OutputCallback | None) -> tuple[str, str]:
    """Start the exec and read its output to the end: frames of stdout and stderr, each decoded as it comes."""
    decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in _STREAMS.values()}
    parts: dict[OutputStream, list[str]] = {name: [] for name in _STREAMS.values()}
    async with engine_stream("POST", f"/libpod/exec/{segment(exec_id)}/start", json={"Detach": False, "Tty": False}) as response:
        if response.status_code != 200:
            await response.aread()
            message = str(engine_error(response, "starting the exec"))
            return "", f"Error: {message}\n"
        pending = bytearray()
        async for chunk in response.aiter_raw():
            pending += chunk
            while len(pending) >= _FRAME_HEADER.size:
                kind, size = _FRAME_HEADER.unpack_from(pending)
                if len(pending) < _FRAME_HEADER.size + size:
                    break
                name = _STREAMS.get(kind, "stderr")
                text = decoders[name].decode(bytes(pending[_FRAME_HEADER.size : _FRAME_HEADER.size + size]))
                del pending[: _FRAME_HEADER.size + size]
                parts[name].append(text)
                if callback and text:
                    await callback(text, name)
    for name, decoder in decoders.items():
        parts[name].append(decoder.decode(b"", final=True))
    return "".join(parts["stdout"]), "".join(parts["stderr"])


async def _exit_code(exec_id: str) -> int:
    """The exec's exit status, once the service has recorded it (it follows the output's end)."""
    deadline = asyncio.get_running_loop().time() + _EXIT_REPORT_SEC
    while True:
        inspected = await engine_call("GET", f"/libpod/exec/{segment(exec_id)}/json", timeout=STATE_CALL_TIMEOUT_SEC)
        if inspected.status_code != 200:
            raise engine_error(inspected, f"reading the exit status of exec {exec_id}")
        state = inspected.json()
        if not state.get("Running"):
            code = state.get("ExitCode")
            return code if isinstance(code, int) and code >= 0 else ENGINE_FAILED
        if asyncio.get_running_loop().time() > deadline:
            return ENGINE_FAILED  # its output ended but it runs on: no status to report, and not a success
        await asyncio.sleep(0.05)


async def _kill_exec(container: str, marker: str, *, inside: bool) -> None:
    """Kill every process the exec started ``inside`` the container (they carry its marker)."""
    if not inside:
        return
    script = (
        f"for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
        f"grep -qx {marker} && kill -9 ${{p#/proc/}} 2>/dev/null; done; true"
    )
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            exec_in(container, ["sh", "-c", script], workdir=None, variables={}, timeout_sec=None, user="root", running=lambda _: False),
            30,
        )
