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

import json
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC, start_podman
from prefect_harbor.sandbox.engine_service import engine_call, segment
from prefect_harbor.sandbox.owners import start_time, started_at

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
    """Where the host sees a running container: its init's host pid, its root file system, its addresses."""

    init_pid: int
    root: Path
    #: The folder its commands (``test.sh`` among them) start in.
    workdir: str = "/"
    #: Its init's start time (clock ticks after boot): the view holds while that very process lives.
    init_started: int = 0
    #: Its addresses on its networks (IPv4 and global IPv6; none on ``--network none``).
    addresses: tuple[str, ...] = ()

    @classmethod
    async def of(cls, container: str) -> ContainerRoot | None:
        """The running container's view, or None when podman cannot say (it stopped).

        Asked of the engine once per container while its init lives (a trial asks three to five
        times): a view is kept only with its init's start time, and given again
        only while the process of that pid started then, so a pid reused after the container
        stopped is never taken for its init."""
        if (known := _VIEWS.get(container)) is not None and start_time(known.init_pid) == known.init_started:
            return known
        _VIEWS.pop(container, None)
        found = await engine_call("GET", f"/libpod/containers/{segment(container)}/json", timeout=STATE_CALL_TIMEOUT_SEC)
        view = cls._parse(found.content) if found.status_code == 200 else None
        if view is not None:
            _VIEWS[container] = view
            while len(_VIEWS) > _MOST_VIEWS:
                _VIEWS.pop(next(iter(_VIEWS)))
        return view

    @classmethod
    def _parse(cls, inspected: bytes) -> ContainerRoot | None:
        """The view in the engine's inspection of a container (JSON), or None when it shows no running container."""
        try:
            details = json.loads(inspected)
            pid, merged = details["State"]["Pid"], details["GraphDriver"]["Data"]["MergedDir"]
            workdir = details["Config"].get("WorkingDir") or "/"
            networks = (details.get("NetworkSettings") or {}).get("Networks") or {}
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if not isinstance(pid, int) or pid <= 0 or not isinstance(merged, str) or not merged.startswith("/") or (started := start_time(pid)) is None:
            return None
        found = [network.get(key) for network in networks.values() if isinstance(network, dict) for key in ("IPAddress", "GlobalIPv6Address")]
        addresses = tuple(address for address in found if isinstance(address, str) and address)
        return cls(pid, Path(merged), workdir if isinstance(workdir, str) and workdir.startswith("/") else "/", started, addresses)


#: Views of running containers, by the name or id they were asked for (oldest first).
_VIEWS: dict[str, ContainerRoot] = {}
_MOST_VIEWS = 256


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
    started = started_at(stat_line)
    status = _read(f"/proc/{pid}/status", 16384).decode(errors="replace")
    inner = next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:"))
    command = _read(f"/proc/{pid}/cmdline", _COMMAND_BYTES).replace(b"\0", b" ").decode(errors="replace").strip()
    return Process(pid=pid, inner_pid=int(inner), started=started, command=command or "[" + stat_line.split("(", 1)[-1].split(")")[0] + "]")


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(limit)


def _parts(path: PurePosixPath | str) -> tuple[str, ...] | None:
    """The names on the way to the absolute ``path``, or None when one is ``..`` (which would leave
    the root file system: the host's view of it is a folder of the host's)."""
    parts = PurePosixPath(path).parts
    if not parts or parts[0] != "/" or ".." in parts:
        return None
    return parts[1:]


def _folder(root: Path, names: tuple[str, ...]) -> int | None:
    """A descriptor of the folder reached from ``root`` through ``names``, each a plain folder (no
    link followed), or None. The caller closes it."""
    try:
        current = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    for name in names:
        try:
            following = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current)
        except OSError:
            following = None
        os.close(current)
        if following is None:
            return None
        current = following
    return current


def _at[T](root: Path, path: PurePosixPath | str, act: Callable[[str, int], T]) -> T | None:
    """``act(name, folder)`` with the last name of ``path`` and a descriptor of the folder holding it
    (reached as :func:`_folder` reaches it); None when it cannot be reached or ``act`` fails."""
    parts = _parts(path)
    if not parts:
        return None
    folder = _folder(root, parts[:-1])
    if folder is None:
        return None
    try:
        return act(parts[-1], folder)
    except OSError:
        return None
    finally:
        os.close(folder)


def lstat_inside(root: Path, path: PurePosixPath | str) -> os.stat_result | None:
    """``lstat`` of ``path`` in the container whose root file system is ``root``, or None when it
    does not exist or a folder on the way to it is not a plain folder (a link is never followed)."""
    if _parts(path) == ():
        try:
            return os.stat(root)
        except OSError:
            return None
    return _at(root, path, lambda name, folder: os.stat(name, dir_fd=folder, follow_symlinks=False))


def open_inside(root: Path, path: PurePosixPath | str) -> int | None:
    """A read-only descriptor of the regular file ``path`` in the container whose root file system
    is ``root``, or None when it is not one (a link, a FIFO or a device is never opened for reading,
    and no link on the way is followed). The caller closes it."""
    handle = _at(root, path, lambda name, folder: os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder))
    if handle is not None and not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        return None
    return handle


def list_inside(root: Path, folder: PurePosixPath | str) -> list[str]:
    """The names in ``folder`` of the container whose root file system is ``root`` (none when it is
    not a plain folder reached without links)."""
    parts = _parts(folder)
    handle = _folder(root, parts) if parts is not None else None
    if handle is None:
        return []
    try:
        return sorted(os.listdir(handle))
    finally:
        os.close(handle)


def readlink_inside(root: Path, path: PurePosixPath | str) -> str | None:
    """Where the link ``path`` points (its text, not followed), or None when it is not a link."""
    return _at(root, path, lambda name, folder: os.readlink(name, dir_fd=folder))


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
