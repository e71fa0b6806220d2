"""A running container seen from the host, trusting nothing inside it.

An agent that is root in its container can replace any program there (``ps``, ``tar``, the
shell, the dynamic loader's settings), so what the sandbox records about a container's state
never runs anything of the container's, nor enters its namespaces:

* its processes are read from the host's ``/proc``, those in the container's pid namespace
  (:func:`processes`), not from ``podman top``, which in podman 4.3 joins the container's
  mount namespace and so loads the container's ``/etc/ld.so.preload`` into a host process;
* its files are looked at through the host's view of its root file system, one name at a
  time, never following a link the agent planted (:func:`lstat_inside`);
* what changed against its image is ``podman diff``, read as a stream (:func:`changes`): an
  agent that wrote a million files costs lines read, not memory.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC, podman, start_podman

#: How much of a process's command line is read.
_COMMAND_BYTES = 4096


@dataclass(frozen=True)
class Process:
    """One process of the container: its host pid, its pid inside, and what it runs."""

    pid: int
    inner_pid: int
    #: When it started (clock ticks after boot): with ``pid``, which process this is, even after a pid is reused.
    started: int
    command: str

    @property
    def identity(self) -> tuple[int, int]:
        return self.pid, self.started

    def describe(self) -> str:
        return f"pid {self.inner_pid}: {self.command[:120]}"


@dataclass(frozen=True)
class ContainerRoot:
    """Where the host sees a running container: its init's host pid and its root file system."""

    init_pid: int
    root: Path

    @classmethod
    async def of(cls, container: str) -> ContainerRoot | None:
        """The running container's view, or None when podman cannot say (it stopped)."""
        found = await podman("inspect", "--format", "{{.State.Pid}} {{.GraphDriver.Data.MergedDir}}", container, timeout=STATE_CALL_TIMEOUT_SEC)
        pid, _, merged = found.text.partition(" ")
        if found.returncode != 0 or not pid.isdigit() or int(pid) <= 0 or not merged.startswith("/"):
            return None
        return cls(int(pid), Path(merged))


def processes(init_pid: int) -> list[Process]:
    """The processes in ``init_pid``'s pid namespace, read from the host's ``/proc``."""
    found = []
    for pid in pids_in_namespace(init_pid):
        try:
            found.append(process(pid))
        except (OSError, ValueError, StopIteration):  # gone meanwhile
            continue
    return found


def pids_in_namespace(init_pid: int) -> list[int]:
    """The host pids of the processes in ``init_pid``'s pid namespace (none once it is gone)."""
    try:
        namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == namespace:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def process(pid: int) -> Process:
    """The process of host pid ``pid``; OSError when it is gone."""
    stat_line = _read(f"/proc/{pid}/stat", 4096).decode(errors="replace")
    started = int(stat_line[stat_line.rindex(")") + 2 :].split()[19])  # field 22, counted after the command's ")"
    status = _read(f"/proc/{pid}/status", 16384).decode(errors="replace")
    inner = next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:"))
    command = _read(f"/proc/{pid}/cmdline", _COMMAND_BYTES).replace(b"\0", b" ").decode(errors="replace").strip()
    return Process(pid=pid, inner_pid=int(inner), started=started, command=command or "[" + stat_line.split("(", 1)[-1].split(")")[0] + "]")


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(limit)


def lstat_inside(root: Path, path: PurePosixPath | str) -> os.stat_result | None:
    """``lstat`` of ``path`` in the container whose root file system is ``root``, or None when it
    does not exist or a folder on the way to it is not a plain folder (a link is never followed)."""
    parts = PurePosixPath(path).parts[1:]
    try:
        current = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current)
            os.close(current)
            current = following
        return os.stat(parts[-1], dir_fd=current, follow_symlinks=False) if parts else os.fstat(current)
    except OSError:
        return None
    finally:
        os.close(current)


def is_folder(found: os.stat_result | None) -> bool:
    return found is not None and stat.S_ISDIR(found.st_mode)


async def changes(container: str, wanted: Callable[[str], bool]) -> AsyncIterator[tuple[str, str]]:
    """``(kind, path)`` for each path ``podman diff`` lists that ``wanted`` accepts: kind ``C``
    (changed from the image), ``A`` (added) or ``D`` (deleted)."""
    process = await start_podman("diff", container, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            kind, _, path = line.decode(errors="surrogateescape").rstrip("\n").partition(" ")
            if kind in ("C", "A", "D") and path.startswith("/") and wanted(path):
                yield kind, path
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
