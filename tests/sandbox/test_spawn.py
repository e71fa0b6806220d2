"""Engine processes are started off the event loop and still behave as asyncio's own do."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time

import pytest

from prefect_harbor.sandbox import spawn
from prefect_harbor.sandbox.spawn import start_engine_process

PIPES = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
#: No input, output collected, an empty environment.
QUIET = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={})


async def test_output_input_and_exit_status_come_through():
    process = await start_engine_process(["sh", "-c", "cat; echo oops >&2; exit 3"], **PIPES)
    stdout, stderr = await process.communicate(b"hello\n" * 50_000)  # more than a pipe holds: fed while read
    assert (stdout, stderr, process.returncode) == (b"hello\n" * 50_000, b"oops\n", 3)


async def test_the_start_runs_in_a_starter_thread_not_on_the_loop(monkeypatch):
    started_on: list[str] = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started_on.append(threading.current_thread().name)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(spawn.subprocess, "Popen", recording_popen)
    process = await start_engine_process(["true"], **QUIET)
    await process.communicate()
    assert started_on and started_on[0].startswith("engine-start")


async def test_the_loop_runs_while_a_start_is_slow(monkeypatch):
    """A start that blocks its thread (as vfork does on a loaded machine) does not block the loop."""
    real_popen = subprocess.Popen

    def slow_popen(*args, **kwargs):
        time.sleep(0.5)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(spawn.subprocess, "Popen", slow_popen)
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    process = await start_engine_process(["true"], **QUIET)
    await process.communicate()
    ticker.cancel()
    assert ticks >= 20  # ~50 in 0.5 s; zero had the start run on the loop


async def test_kill_ends_the_process_and_wait_reports_the_signal():
    process = await start_engine_process(["sleep", "30"], **QUIET)
    assert process.returncode is None
    process.kill()
    assert await asyncio.wait_for(process.wait(), 10) == -9
    process.kill()  # after the exit: nothing to kill, no error


async def test_a_start_given_up_on_is_killed_and_reaped(monkeypatch):
    """Cancelled while its process is being started: the process must not live on, unwatched."""
    real_popen = subprocess.Popen
    started: list[subprocess.Popen] = []

    def slow_popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        time.sleep(0.3)
        return started[-1]

    monkeypatch.setattr(spawn.subprocess, "Popen", slow_popen)
    starting = asyncio.create_task(start_engine_process(["sleep", "30"], **QUIET))
    await asyncio.sleep(0.1)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    deadline = time.monotonic() + 10
    while started[0].returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert started[0].returncode == -9


def _start_in_a_forked_child() -> None:
    async def start() -> bytes:
        process = await start_engine_process(["echo", "child"], **QUIET)
        return (await process.communicate())[0]

    os._exit(0 if asyncio.run(asyncio.wait_for(start(), 10)) == b"child\n" else 1)


async def test_a_forked_child_starts_processes_with_starter_threads_of_its_own():
    """A child forked after the parent used its starter threads has none of them: it must make its own, not wait forever."""
    import multiprocessing
    import warnings

    await (await start_engine_process(["true"], **QUIET)).communicate()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a threaded process: what is tested here
        child = multiprocessing.get_context("fork").Process(target=_start_in_a_forked_child)
        child.start()
    await asyncio.to_thread(child.join, 30)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0
