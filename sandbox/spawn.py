"""Engine processes started off the event loop, then watched by it.

Starting a process blocks the calling thread until the child has called exec (CPython
vforks). On an idle machine that is 0.2 ms; with the cores busy it is 8-16 ms a start,
since the child must be scheduled before the parent resumes. Every terminus-2 turn makes a
few ``podman exec`` calls, so with 32 agents on one loop those waits were the largest
thing holding it (``docs/performance.md``, "Session 8"). So the fork and exec run in a
small thread pool, and the loop then reads the pipes (``connect_read_pipe``) and learns of
the exit from a pidfd, as asyncio's own subprocess support does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO

#: Starts are short even when slow, so a few threads keep up with any number of trials.
STARTER_THREADS = 4
_starters: ThreadPoolExecutor | None = None
#: asyncio's own default for a subprocess's stream buffers.
_STREAM_LIMIT = 2**16

Stdio = int | IO[bytes] | None


class EngineProcess:
    """The part of :class:`asyncio.subprocess.Process` the sandbox uses, for a process started off the loop."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader | None, stderr: asyncio.StreamReader | None):
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self.stderr = stderr
        self._exited = _exit_of(popen)

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    def kill(self) -> None:
        """SIGKILL, if it has not exited: its pid is not reaped (so not reused) until it has."""
        if not self._exited.done():
            self._popen.kill()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        """Send ``input`` (written from a thread, so a child slow to read blocks no loop), read both streams to the end, wait."""

        async def read(stream: asyncio.StreamReader | None) -> bytes:
            return await stream.read() if stream is not None else b""

        feed = asyncio.to_thread(self._feed, input) if input is not None else asyncio.sleep(0)
        _, stdout, stderr = await asyncio.gather(feed, read(self.stdout), read(self.stderr))
        await self.wait()
        return stdout, stderr

    def close_stdin(self) -> None:
        """End the child's input (a ``PIPE`` stdin): what tells a helper that waits on it to finish."""
        if self._popen.stdin is not None and not self._popen.stdin.closed:
            self._popen.stdin.close()

    def _feed(self, data: bytes) -> None:
        assert self._popen.stdin is not None, "started with stdin=PIPE"
        with contextlib.suppress(BrokenPipeError), self._popen.stdin as pipe:  # a child that exits early reads no more
            pipe.write(data)


def _discard_once_started(done: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    """A start whose caller was cancelled: the process it made, if any, killed and reaped."""
    if not done.cancelled() and done.exception() is None:
        _discard(done.result(), close_pipes=True)


def _starter_pool() -> ThreadPoolExecutor:
    """The starter threads of this process (a forked child makes its own: it has none of its parent's threads)."""
    global _starters
    if _starters is None:
        _starters = ThreadPoolExecutor(max_workers=STARTER_THREADS, thread_name_prefix="engine-start")
    return _starters


def _forget_starters() -> None:
    global _starters
    _starters = None


os.register_at_fork(after_in_child=_forget_starters)


async def start_engine_process(argv: list[str], *, stdin: Stdio, stdout: Stdio, stderr: Stdio, env: dict[str, str]) -> EngineProcess:
    """``subprocess.Popen(argv, ...)`` in a starter thread; its ``PIPE`` outputs become the loop's stream readers.

    If the caller is cancelled while the start is under way, the process is killed and
    reaped as soon as it exists."""
    loop = asyncio.get_running_loop()
    # Bytes, not text (no text=True): typeshed's overloads cannot tell through functools.partial.
    start: Callable[[], subprocess.Popen[bytes]] = functools.partial(subprocess.Popen, argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env)  # type: ignore[assignment]
    starting = loop.run_in_executor(_starter_pool(), start)
    try:
        popen = await asyncio.shield(starting)
    except asyncio.CancelledError:
        starting.add_done_callback(_discard_once_started)
        raise
    try:
        return EngineProcess(popen, await _stream(popen.stdout), await _stream(popen.stderr))
    except BaseException:  # cancelled while its pipes were being connected: a connected one is its transport's to close
        _discard(popen, close_pipes=False)
        raise


async def _stream(pipe: IO[bytes] | None) -> asyncio.StreamReader | None:
    if pipe is None:
        return None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_STREAM_LIMIT, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader


def _exit_of(popen: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """A future of the exit status, set when the process's pidfd turns readable (then it is reaped)."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:  # a kernel before 5.3: a thread waits instead
        return asyncio.ensure_future(asyncio.to_thread(popen.wait))
    exited: asyncio.Future[int] = loop.create_future()

    def reap() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        exited.set_result(popen.wait())

    loop.add_reader(pidfd, reap)
    return exited


def _discard(popen: subprocess.Popen[bytes], *, close_pipes: bool) -> None:
    """The process of a start its caller gave up on: killed and reaped in a thread; its pipes
    closed only when no transport has them (closing a registered fd under the loop could
    later read another file that got the same number)."""
    popen.kill()
    if close_pipes:
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                pipe.close()
    _starter_pool().submit(popen.wait)
