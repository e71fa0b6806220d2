"""Put a fresh copy of a task's tests at ``/tests`` in a running container, writable by the
verifier and by nothing the agent left running: a helper process.

``python -I -S tests_mount.py INIT_PID STAGING DROP SIZE_MB`` makes a new tmpfs of at most
``SIZE_MB`` that no mount namespace holds yet (``fsopen``/``fsmount``) and copies the folder ``STAGING`` into it through the mount's
file descriptor, owned by the container's root (its user namespace's, where it has one). A
child process enters the container's mount namespace, unmounts the ``DROP`` copies put there
before, and attaches the new one on ``/tests`` (``move_mount``): the tests appear whole, in
one step, so nothing can slip a file in while they are copied.

The verifier may then write there as under Docker (build in place, add files). A process the
agent left running shares the mount, so three walls keep it from the tests:

* every file copied is immutable (``FS_IMMUTABLE_FL``; the container has no
  ``CAP_LINUX_IMMUTABLE``): no process rewrites, renames, removes or links it;
* the mount follows no symbolic link (``nosymfollow``): a link planted under an expected name
  leads nowhere;
* the helper stays, answering the kernel's permission question for every open of a file in
  the copy (fanotify ``FAN_OPEN_PERM``): only a process descended from an exec started after
  the copy was attached (the verifier's own commands, which Harbor runs with ``exec``) may
  open one; a process from before, or one of its children, or an orphan adopted by the
  container's init, is refused, so it can neither read the tests nor fill a file it created.

A process whose lineage cannot be read (a parent leaving, its child not yet handed on) is
read again for up to :data:`_SETTLE_SEC` before it is refused; the first refusal of each lineage (up to
:data:`DESCRIBED_REFUSALS` lineages) is described on standard error (the lineage read), which
the trial's log shows.

It prints ``attached`` (or ``error STAGE ERRNO``), then answers until its standard input
closes. The child, host root in the container's mount namespace, runs nothing of the
container's: everything it needs (``libc``'s functions, paths as bytes) is loaded before it
enters, and it leaves with ``os._exit`` (no import, no clean-up, no traceback reading a file
there). Standard library only, like :mod:`.exit_clock`.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import stat
import struct
import sys
import time
from collections.abc import Callable

# Linux's numbers for the new mount API (the same on every architecture since 5.2).
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSOPEN_CLOEXEC = 0x1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_NOSYMFOLLOW = 0x00200000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MNT_DETACH = 0x2
_UMOUNT_NOFOLLOW = 0x8
_TARGET = b"/tests"
#: How long a process whose lineage cannot be read is read again before its open is refused.
_SETTLE_SEC = 1.0
#: Refusals described on standard error: enough to tell why, too few to fill the pipe it goes to.
DESCRIBED_REFUSALS = 5
#: Generations a refusal's description follows up from the process that was refused.
_DESCRIBED_GENERATIONS = 12
_FS_IOC_SETFLAGS = 0x40086602
_FS_IMMUTABLE_FL = 0x10
_FAN_CLASS_CONTENT = 0x4
_FAN_CLOEXEC = 0x1
_FAN_MARK_ADD = 0x1
_FAN_MARK_FILESYSTEM = 0x100
_FAN_OPEN_PERM = 0x10000
_FAN_OPEN_EXEC_PERM = 0x40000
_FAN_ALLOW = 0x1
_FAN_DENY = 0x2
#: ``struct fanotify_event_metadata``: event_len, vers, reserved, metadata_len, mask, fd, pid.
_EVENT = struct.Struct("IBBHQii")
#: ``struct fanotify_response``: fd, response.
_RESPONSE = struct.Struct("iI")


class StageError(Exception):
    """A step that failed, with its errno: the parent turns it into words."""

    def __init__(self, stage: str, errno: int):
        super().__init__(stage, errno)
        self.stage = stage
        self.errno = errno


class _Libc:
    """The C functions the helper calls, looked up before any namespace changes."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.syscall: Callable[..., int] = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.umount2: Callable[..., int] = libc.umount2
        self.fanotify_init: Callable[..., int] = libc.fanotify_init
        self.fanotify_mark: Callable[..., int] = libc.fanotify_mark
        libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
        libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]


def _checked(result: int, stage: str) -> int:
    if result < 0:
        raise StageError(stage, ctypes.get_errno())
    return result


def root_ids(init_pid: int) -> tuple[int, int]:
    """The host uid and gid of the container's root (0 and 0 without a user namespace)."""

    def mapped(table: str) -> int:
        with open(f"/proc/{init_pid}/{table}") as handle:
            for line in handle:
                inside, outside, _count = (int(field) for field in line.split())
                if inside == 0:
                    return outside
        raise StageError(f"{table}-has-no-root", 0)

    return mapped("uid_map"), mapped("gid_map")


def new_tmpfs(syscall: Callable[..., int], uid: int, gid: int, size_mb: int) -> int:
    """A detached tmpfs's mount fd: root folder 0755, owned by the container's root; no set-id, no devices."""
    fs = _checked(syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC), "fsopen")
    try:
        options = ((b"mode", b"755"), (b"uid", str(uid).encode()), (b"gid", str(gid).encode()), (b"size", f"{size_mb}m".encode()))
        for key, value in options:
            _checked(syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, value, 0), "fsconfig")
        _checked(syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig-create")
        attributes = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOSYMFOLLOW
        return _checked(syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, attributes), "fsmount")
    finally:
        os.close(fs)


def copy_tree(source: int, target: int, uid: int, gid: int, *, immutable: bool = True) -> None:
    """Folder fd ``source`` into folder fd ``target``, as ``docker cp`` copies: modes kept, links
    copied as links (never followed), other kinds (FIFOs, devices, sockets) left out. Files are
    made immutable; folders stay writable, for what the verifier adds."""
    for entry in os.scandir(source):
        name = entry.name
        info = entry.stat(follow_symlinks=False)
        mode = stat.S_IMODE(info.st_mode) & 0o1777  # no set-id bits
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(name, 0o700, dir_fd=target)
            inner_source = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=source)
            inner_target = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=target)
            try:
                copy_tree(inner_source, inner_target, uid, gid, immutable=immutable)
                os.chmod(inner_target, mode)
                os.chown(inner_target, uid, gid)
            finally:
                os.close(inner_source)
                os.close(inner_target)
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
            os.chown(name, uid, gid, dir_fd=target, follow_symlinks=False)
        elif stat.S_ISREG(info.st_mode):
            reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=source)
            writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=target)
            try:
                while chunk := os.read(reader, 1 << 20):
                    os.write(writer, chunk)
                os.chmod(writer, mode)
                os.chown(writer, uid, gid)
                if immutable:
                    fcntl.ioctl(writer, _FS_IOC_SETFLAGS, struct.pack("l", _FS_IMMUTABLE_FL))
            finally:
                os.close(reader)
                os.close(writer)


class Guard:
    """Answers the kernel for each open of a file in the copy (see the module docstring)."""

    def __init__(self, libc: _Libc, mount: int, init_pid: int):
        event_flags = os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC | os.O_NONBLOCK
        self.fd = _checked(libc.fanotify_init(_FAN_CLASS_CONTENT | _FAN_CLOEXEC, event_flags), "fanotify_init")
        _checked(libc.fanotify_mark(self.fd, _FAN_MARK_ADD | _FAN_MARK_FILESYSTEM, _FAN_OPEN_PERM | _FAN_OPEN_EXEC_PERM, mount, b"."), "fanotify_mark")
        self._init_pid = init_pid
        self._pid_namespace = _pid_namespace(init_pid)
        self._since = 0
        self._told: set[int] = set()  # the lineages (by the pid each ends at) whose first refusal was described

    def open_from_now(self) -> None:
        """Execs started from now on are the verifier's."""
        self._since = int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))

    def allows(self, pid: int) -> bool:
        """Whether process ``pid`` (a host pid) is of an exec started since :meth:`open_from_now`.

        A lineage that cannot be read is read again until :data:`_SETTLE_SEC` has passed: each
        reading is judged whole, so no half-read state is let through."""
        deadline, pause = time.monotonic() + _SETTLE_SEC, 0.001
        while True:
            try:
                return self._judge(pid)
            except (OSError, ValueError, IndexError):
                if time.monotonic() >= deadline:
                    return False  # still unreadable (gone, or leaving): not provably the verifier's
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _judge(self, pid: int) -> bool:
        if _pid_namespace(pid) != self._pid_namespace:
            return True  # the host's own (root's tools): no process of the container
        while True:
            parent, inside = self._parent_of(pid)
            if not inside:
                break  # ``pid`` is an exec's first process, or the container's init
            pid = parent
        return pid != self._init_pid and _started(pid) >= self._since

    def refusal_to_tell(self, pid: int) -> str | None:
        """The lineage of a refused process as read now (pid, parent, start tick, in or out of the
        container), for the first refusal of each lineage (by the pid it ends at), at most
        :data:`DESCRIBED_REFUSALS` of them: a process the agent left opening the tests in a loop (its
        lineage ends at the container's init) is told once, and leaves room for any other refusal."""
        lineage = self._lineage(pid)
        root = lineage[-1][0]
        if root in self._told or len(self._told) >= DESCRIBED_REFUSALS:
            return None
        self._told.add(root)
        return self._in_words(lineage)

    def _in_words(self, lineage: list[tuple[int, str]]) -> str:
        chain = " <- ".join(text for _pid, text in lineage)
        return f"refused an open by {chain}; tests attached at tick {self._since}, the container's init is {self._init_pid}"

    def _lineage(self, pid: int) -> list[tuple[int, str]]:
        """``pid`` and its ancestors in the container, each with what was read of it, up to the first outside it."""
        chain = []
        for _ in range(_DESCRIBED_GENERATIONS):
            try:
                fields, namespace = _stat(pid), _pid_namespace(pid)
            except (OSError, ValueError, IndexError) as error:
                chain.append((pid, f"{pid} unreadable ({type(error).__name__})"))
                break
            inside = namespace == self._pid_namespace
            chain.append((pid, f"{pid} (parent {int(fields[1])}, started {int(fields[19])}, {'in' if inside else 'outside'} the container)"))
            if not inside or pid == self._init_pid:
                break
            pid = int(fields[1])
        return chain

    def _parent_of(self, pid: int) -> tuple[int, bool]:
        """``pid``'s parent, and whether it is in the container's pid namespace.

        An exec's first process is started by the runtime (crun), which leaves at once: its
        process is then adopted by conmon. A parent that ended between the two reads raises, and
        :meth:`allows` reads the whole lineage again rather than refusing the open."""
        parent = _parent(pid)
        return parent, _pid_namespace(parent) == self._pid_namespace

    def answer(self) -> None:
        """Answer every permission question queued now."""
        data = os.read(self.fd, 64 * 1024)
        offset = 0
        while offset + _EVENT.size <= len(data):
            length, _version, _reserved, _meta, _mask, fd, pid = _EVENT.unpack_from(data, offset)
            offset += max(length, _EVENT.size)
            if fd < 0:
                continue
            try:
                allowed = self.allows(pid)
                os.write(self.fd, _RESPONSE.pack(fd, _FAN_ALLOW if allowed else _FAN_DENY))
            finally:
                os.close(fd)
            if not allowed and (told := self.refusal_to_tell(pid)) is not None:
                os.write(2, told.encode(errors="replace")[:1000] + b"\n")

    def serve(self, control: int) -> None:
        """Answer until ``control`` (standard input) closes; closing the group lets pending opens through."""
        while True:
            ready, _, _ = select.select([self.fd, control], [], [])
            if control in ready and not os.read(control, 1024):
                return
            if self.fd in ready:
                self.answer()


def _stat(pid: int) -> list[bytes]:
    """``/proc/PID/stat``'s fields after the command name (which the process sets: read past its last ``)``).

    The twin of :mod:`.exit_clock`'s: each is a script run with ``-I``, which cannot import a sibling."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        line = handle.read(4096)
    return line[line.rindex(b")") + 2 :].split()


def _pid_namespace(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def _parent(pid: int) -> int:
    return int(_stat(pid)[1])


def _started(pid: int) -> int:
    return int(_stat(pid)[19])


def prepare(libc: _Libc, init_pid: int, staging: str, size_mb: int) -> tuple[int, Guard]:
    """The filled tmpfs's mount fd, and its guard, before anything of the container can see it."""
    uid, gid = root_ids(init_pid)
    mount = new_tmpfs(libc.syscall, uid, gid, size_mb)
    source = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        copy_tree(source, mount, uid, gid)
    except OSError as error:
        raise StageError("copy", error.errno or 0) from None
    finally:
        os.close(source)
    return mount, Guard(libc, mount, init_pid)


def attach(libc: _Libc, init_pid: int, mount: int, drop: int) -> None:
    """In a child: enter the container's mount namespace, drop the old copies, attach ``mount`` at ``/tests``."""
    try:
        namespace = os.open(f"/proc/{init_pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise StageError("namespace", error.errno or 0) from None
    if os.fstat(namespace).st_ino == os.stat("/proc/self/ns/mnt").st_ino:  # the pid is no longer the container's
        raise StageError("same-namespace", 0)
    child = os.fork()
    if child == 0:  # From here on, paths resolve in the container: nothing may be imported or run.
        code = 0
        try:
            os.setns(namespace, os.CLONE_NEWNS)
            for _ in range(drop):
                if libc.umount2(_TARGET, _MNT_DETACH | _UMOUNT_NOFOLLOW) < 0:
                    code = 10
                    break
            if code == 0:
                target = os.open(_TARGET, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                if libc.syscall(_SYS_MOVE_MOUNT, mount, b"", target, b"", _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH) < 0:
                    code = 11
            if code:
                os.write(1, b"error " + (b"umount" if code == 10 else b"move_mount") + b" " + str(ctypes.get_errno()).encode() + b"\n")
        except BaseException:  # noqa: BLE001 - no traceback here
            code = 12
            os.write(1, b"error attach 0\n")
        os._exit(code)
    os.close(namespace)
    _, status = os.waitpid(child, 0)
    if status != 0:
        raise StageError("reported", 0)


def main(argv: list[str]) -> int:
    init_pid, staging, drop, size_mb = int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    libc = _Libc()
    try:
        mount, guard = prepare(libc, init_pid, staging, size_mb)
        guard.open_from_now()
        attach(libc, init_pid, mount, drop)
    except StageError as error:
        if error.stage != "reported":
            os.write(1, b"error " + error.stage.encode() + b" " + str(error.errno).encode() + b"\n")
        return 1
    except OSError as error:
        os.write(1, b"error os " + str(error.errno or 0).encode() + b"\n")
        return 1
    os.close(mount)
    os.write(1, b"attached\n")
    guard.serve(0)
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv)
    except BaseException:  # noqa: BLE001 - a traceback would read this file where it stands, maybe in the container
        code = 2
    os._exit(code)
