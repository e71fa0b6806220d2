"""What a container's processes run and open while its verifier runs, seen from the host.

The tamper evidence of :mod:`.program_changes` names changes where the verifier's commands
usually come from. This records what they actually came from: the host marks the container's
root file system (its overlay, one per container) with fanotify, so every file any process in
the container executes or opens, by whatever path, is reported to the host, with a descriptor
the host resolves to its path inside the container. Nothing of the container runs on the host
side, and no container file is read here: the kernel names what was opened.

It needs ``CAP_SYS_ADMIN`` on the host (root's podman); without it there is no such record, and
the verification's notes say so. What it sees is bounded (:data:`MOST_PATHS`); a queue the kernel
overflowed is noted too.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass, field

_FAN_CLASS_NOTIF = 0x0
_FAN_CLOEXEC = 0x1
_FAN_NONBLOCK = 0x2
_FAN_MARK_ADD = 0x1
_FAN_MARK_FILESYSTEM = 0x100
_FAN_OPEN = 0x20
_FAN_OPEN_EXEC = 0x1000
_FAN_Q_OVERFLOW = 0x4000
_AT_FDCWD = -100
#: ``struct fanotify_event_metadata``: event_len, vers, reserved, metadata_len, mask, fd, pid.
_EVENT = struct.Struct("IBBHQii")
#: Reads of the queue per call of :meth:`OpenedFiles.drain` (each up to 64 KiB, some 2,700 events).
_BATCHES = 16
#: The most distinct paths kept for one verification (a test suite opens a few thousand).
MOST_PATHS = 100_000


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    return libc


@dataclass
class OpenedFiles:
    """Files opened (and executed) in one container since :meth:`start`: path inside the container -> whether it was executed."""

    root: str
    paths: dict[str, bool] = field(default_factory=dict)
    overflowed: bool = False
    _fd: int = -1

    @classmethod
    def start(cls, root: str) -> OpenedFiles:
        """Watch the file system whose root the host sees at ``root`` (a container's merged overlay).

        Raises OSError when this host cannot (no ``CAP_SYS_ADMIN``, no fanotify)."""
        libc = _libc()
        if libc is None:
            raise OSError(errno.ENOSYS, "no C library to call fanotify through")
        # The kernel opens each event's file for us with these flags. This kernel reports no
        # FIFO's opening; O_NONBLOCK so that one that did could not hold this process.
        event_flags = os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC | os.O_NONBLOCK
        descriptor = libc.fanotify_init(_FAN_CLASS_NOTIF | _FAN_CLOEXEC | _FAN_NONBLOCK, event_flags)
        if descriptor < 0:
            raise OSError(ctypes.get_errno(), f"fanotify_init: {os.strerror(ctypes.get_errno())}")
        marked = libc.fanotify_mark(descriptor, _FAN_MARK_ADD | _FAN_MARK_FILESYSTEM, _FAN_OPEN | _FAN_OPEN_EXEC, _AT_FDCWD, os.fsencode(root))
        if marked < 0:
            failure = ctypes.get_errno()
            os.close(descriptor)
            raise OSError(failure, f"fanotify_mark {root}: {os.strerror(failure)}")
        watch = cls(root.rstrip("/"), _fd=descriptor)
        asyncio.get_running_loop().add_reader(descriptor, watch.drain)
        return watch

    def drain(self) -> bool:
        """Read queued events, at most :data:`_BATCHES` reads at a time: note each path, close each
        descriptor. True when the queue was emptied. Bounded, so that a process of the container
        opening files without end cannot hold the sweep's event loop here: the loop calls again."""
        for _ in range(_BATCHES):
            if self._fd < 0:
                return True
            try:
                events = os.read(self._fd, 64 * 1024)
            except (BlockingIOError, InterruptedError):
                return True
            offset = 0
            while offset + _EVENT.size <= len(events):
                length, _, _, _, mask, descriptor, _ = _EVENT.unpack_from(events, offset)
                offset += max(length, _EVENT.size)
                if mask & _FAN_Q_OVERFLOW:
                    self.overflowed = True
                if descriptor >= 0:
                    self._note(descriptor, bool(mask & _FAN_OPEN_EXEC))
        return False

    def _note(self, descriptor: int, executed: bool) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            return
        finally:
            os.close(descriptor)
        # Opened through the host's own view (podman, the sandbox reading files): not the container's doing.
        if path.startswith(self.root + "/") or not path.startswith("/"):
            return
        path = path.removesuffix(" (deleted)")
        if path in self.paths or len(self.paths) < MOST_PATHS:
            self.paths[path] = self.paths.get(path, False) or executed
        else:
            self.overflowed = True

    def stop(self) -> None:
        """Stop watching: the queued events are read first."""
        if self._fd < 0:
            return
        if not self.drain():
            self.overflowed = True  # what was still queued is dropped with the descriptor
        asyncio.get_running_loop().remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
