"""When an exec's process exits in a container, to the millisecond: a helper process of its own.

``python -I -S exit_clock.py INIT_PID MARKER`` prints ``ready`` once it watches, then finds the
first process of the container whose environment holds ``MARKER`` (the ``NAME=value`` variable
one ``podman exec`` runs with), waits on its pidfd, and prints the time it exited (ns since the
epoch), or an empty line when it never saw it; closing its stdin tells it the exec is over.
``podman exec`` itself returns tens of milliseconds after its process exits, and a thread of
the sweep, sharing the event loop's GIL, polls too slowly to see a ``test.sh`` of a few
milliseconds: a process of its own, reading only the container's cgroup and ``/proc``, and
scheduled ahead of the rest (:func:`hurry`; on a loaded machine without it, 1 run in 8 went
unseen), sees it. Standard library only, so it starts in milliseconds (``-S``: no site packages).
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable


def cgroup_procs(init_pid: int) -> str | None:
    """The ``cgroup.procs`` file listing every process of the container whose init is ``init_pid``."""
    try:
        with open(f"/proc/{init_pid}/cgroup") as handle:
            lines = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return None
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            return f"/sys/fs/cgroup{path}/cgroup.procs"
        if "pids" in controllers.split(","):
            return f"/sys/fs/cgroup/pids{path}/cgroup.procs"
    return None


def _pids(procs: str) -> list[int]:
    try:
        with open(procs) as handle:
            return [int(line) for line in handle if line.strip()]
    except OSError:
        return []


def _stat(pid: int) -> list[bytes]:
    """``/proc/PID/stat``'s fields after the command name: state, parent, …, start time (index 19)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        line = handle.read(4096)
    return line[line.rindex(b")") + 2 :].split()


def _started(pid: int) -> int:
    return int(_stat(pid)[19])


def _environ(pid: int) -> bytes:
    """Empty while the process has no environment to read: between ``execve`` giving it its new
    memory and the new environment's address being set, or once it is exiting."""
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return handle.read(256 * 1024)


def _marked(environ: bytes, needle: bytes) -> bool:
    return needle in b"\0" + environ + b"\0"


def _comm(pid: int) -> bytes:
    with open(f"/proc/{pid}/comm", "rb") as handle:
        return handle.read(64)


def find(procs: str, needle: bytes, over: Callable[[], bool], ready: Callable[[], None] = lambda: None) -> tuple[int, int] | None:
    """The exec's first process listed in ``procs``: the one carrying ``needle`` whose parent
    does not (its children inherit the marker, and exit before it): (pid, start), until
    ``over()``; ``ready()`` is called after the first look."""
    seen: set[int] = set()
    while not over():
        marked: dict[int, tuple[int, int]] = {}
        for pid in _pids(procs):
            if pid in seen:
                continue
            try:
                # The name first: runc's own process becomes the exec's when it execs, and a name
                # read after that exec comes with the new environment (read before, an old
                # environment and a new name would have put the exec's process among the seen).
                if _comm(pid).startswith(b"runc"):
                    continue
                environ = _environ(pid)
                if not environ:  # no environment to read yet: look again (seen, its children would pass for the exec's)
                    continue
                if not _marked(environ, needle):
                    seen.add(pid)
                    continue
                fields = _stat(pid)
                marked[pid] = (int(fields[1]), int(fields[19]))
            except (OSError, ValueError, IndexError):
                continue
        roots = [(started, pid) for pid, (parent, started) in marked.items() if parent not in marked and not _marked_again(parent, needle, seen)]
        if roots:
            started, pid = min(roots)
            return pid, started
        ready()
        time.sleep(0.0005)
    return None


def _marked_again(pid: int, needle: bytes, seen: set[int]) -> bool:
    """Whether a process passed over as unmarked carries the marker after all (read again before
    its child is taken for the exec's first process); if so it is looked at again."""
    if pid not in seen:
        return False
    try:
        again = _marked(_environ(pid), needle)
    except OSError:
        return False
    if again:
        seen.discard(pid)
    return again


def exit_time(init_pid: int, marker: str, stdin: int, ready: Callable[[], None] = lambda: None) -> int | None:
    """When the exec's first process exited (see the module docstring), or None."""
    procs = cgroup_procs(init_pid)
    if procs is None:
        ready()
        return None
    ended = False

    def over() -> bool:
        nonlocal ended
        ended = ended or bool(select.select([stdin], [], [], 0)[0])
        return ended

    found = find(procs, f"\0{marker}\0".encode(), over, ready)
    if found is None:
        return None
    pid, started = found
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        if _started(pid) != started:
            return None  # gone, its pid reused, before the pidfd was opened
        while True:
            readable = select.select([pidfd, stdin], [], [], 5)[0]
            if pidfd in readable:
                return time.time_ns()
            if stdin in readable:  # the exec returned and its exit went unseen: no exact time
                return None
    except OSError:
        return None
    finally:
        os.close(pidfd)


def hurry() -> str:
    """Be scheduled as soon as a scan is due, even on a busy machine: real-time (the lowest
    priority of ``SCHED_FIFO``) when allowed, else a lower nice value, else as it is. Between
    scans it sleeps, and once it has the process it only waits, so it takes little CPU."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(os.sched_get_priority_min(os.SCHED_FIFO)))
        return "real-time"
    except (OSError, AttributeError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "normal"


if __name__ == "__main__":
    hurry()
    told = False

    def say_ready() -> None:
        global told
        if not told:
            told = True
            print("ready", flush=True)

    exited = exit_time(int(sys.argv[1]), sys.argv[2], sys.stdin.fileno(), say_ready)
    say_ready()
    print("" if exited is None else exited, flush=True)
