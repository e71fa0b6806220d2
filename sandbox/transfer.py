"""Files in and out of a container as tar streams made and read by trusted code only.

Both directions go through podman's own copier (:func:`copy_in`, :func:`copy_out`: the
archive endpoints of its service, what ``podman cp`` runs), which resolves paths inside the
container's root, never through a ``tar`` binary of the container's: an agent that is
root in its container can replace that binary and forge the archive.

On the host, what comes out is extracted by :func:`unpack`, which writes regular files and
directories only, under plain relative names (no absolute names, no ``..``), and never
through a link: links, hard links, devices and FIFOs are skipped and logged. So whatever an
agent leaves in ``/logs`` -- symlink chains long enough to fool ``os.path.realpath``
(CVE-2025-4517), hard links, forged members -- cannot make the host write or read outside
the target. The bytes written are capped, so a sparse or huge file cannot fill the host's disk;
what the cap drops is counted, files and bytes, reading past it (up to ``max_read`` bytes of the
stream) so that a copy cut short still says what it left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import tarfile
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

import httpx

from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC
from prefect_harbor.sandbox.engine_service import engine_call, engine_error, engine_stream, segment

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
#: A copy past its limit reads on through this many times the limit, counting what it drops.
_COPY_READ_FACTOR = 4
#: The refused members named one by one (the rest are counted).
_NAMED = 50
#: Pauses asked before a copy goes ahead with the container running (:func:`held_still`).
_PAUSE_TRIES = 20


@dataclass
class Unpacked:
    """What :func:`unpack` did: the members written and the ones it refused."""

    written: int = 0
    bytes: int = 0
    #: The first refused members, each with why (``skipped_count`` counts them all).
    skipped: list[str] = field(default_factory=list)
    skipped_count: int = 0
    #: Regular files not written because of the copy limit, and their bytes.
    dropped_files: int = 0
    dropped_bytes: int = 0
    #: The stream was not read to its end (past ``max_read``, or cut short): the counts are a floor.
    stopped_early: bool = False

    def skip(self, what: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < _NAMED:
            self.skipped.append(what)

    def drop(self, size: int) -> None:
        self.dropped_files += 1
        self.dropped_bytes += size


class _ReadLimit(Exception):
    """The stream was read as far as ``max_read`` allows."""


class _Counted:
    """A stream that counts what is read from it, and stops at ``limit`` bytes."""

    def __init__(self, raw: IO[bytes], limit: int | None):
        self._raw, self._limit, self.count = raw, limit, 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.count += len(data)
        if self._limit is not None and self.count > self._limit:
            raise _ReadLimit
        return data


async def copy_in(container: str, source: Path, target: PurePosixPath) -> None:
    """``source`` (a host file or folder) into ``container`` as ``target``, an absolute path: :func:`pack`,
    then the engine's archive upload (``podman cp --archive=false - CONTAINER:/``: owners as packed)."""
    if not target.is_absolute():
        raise ValueError(f"{target}: give an absolute path in the container.")
    with tempfile.TemporaryFile() as archive:
        await asyncio.to_thread(pack, source, target, archive)
        archive.seek(0)
        await put_archive(container, archive, f"copying {source} into the container at {target}")


async def put_archive(container: str, archive: IO[bytes] | bytes, what: str) -> None:
    """A tar stream extracted at ``/`` in ``container`` (running, or created and not started) by podman's
    copier, owners as archived (``podman cp --archive=false - CONTAINER:/``); :class:`EngineError` naming
    ``what`` when the engine refuses."""
    # Docker's endpoint, not libpod's: it keeps the archive's owners (libpod's gives every file the container's user).
    done = await engine_call(
        "PUT", f"/containers/{segment(container)}/archive", params={"path": "/"},
        content=archive if isinstance(archive, bytes) else _chunks(archive),
        headers={"Content-Type": "application/x-tar"}, timeout=STATE_CALL_TIMEOUT_SEC,
    )  # fmt: skip
    if done.status_code != 200:
        raise engine_error(done, what)


async def _chunks(archive: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(archive.read, _CHUNK):
        yield chunk


@contextlib.asynccontextmanager
async def held_still(container: str) -> AsyncIterator[None]:
    """``container`` paused (its processes frozen by the engine) while the body copies out of it.

    podman's copier ends its archive at the first file that grows while it is read ("archive/tar:
    write too long"), after a 200 and a well-formed end: the files after it are silently not copied.
    A process the agent left appending to ``/logs/verifier/a.txt`` would so make the verifier's
    reward vanish, and its row an error rather than a score. Under Docker ``/logs`` is a mount the
    host reads at any time; a frozen container gives the copy the same still picture. A container
    that does not run (stopped, gone) has nothing to freeze, and is copied as it is."""
    route = f"/libpod/containers/{segment(container)}"
    paused = await _asked_until_done(f"{route}/pause")
    if paused.status_code not in (200, 204) and not _not_running(paused):
        logger.warning("Copying out of container %s while it runs: %s", container, engine_error(paused, "pausing it"))
    try:
        yield
    finally:
        if paused.status_code in (200, 204):
            resumed = await _asked_until_done(f"{route}/unpause")
            if resumed.status_code not in (200, 204) and not _not_running(resumed):  # one that ended meanwhile has nothing to resume
                raise engine_error(resumed, f"resuming container {container} after a copy")


async def _asked_until_done(route: str) -> httpx.Response:
    """``POST route`` (a pause or an unpause), asked again while the runtime gives up (HTTP 500: runc's
    cgroup v1 freezer does when a busy process does not freeze in time), up to :data:`_PAUSE_TRIES` times."""
    attempt = 1
    while _gave_up(answer := await engine_call("POST", route, timeout=STATE_CALL_TIMEOUT_SEC)) and attempt < _PAUSE_TRIES:
        await asyncio.sleep(0.05 * attempt)
        attempt += 1
    return answer


def _not_running(answer: httpx.Response) -> bool:
    """The engine's "not running, can't pause" (a 500 with cause "container state improper"), or no such container."""
    return answer.status_code in (404, 409) or (answer.status_code == 500 and _cause(answer) == "container state improper")


def _gave_up(answer: httpx.Response) -> bool:
    return answer.status_code == 500 and not _not_running(answer)


def _cause(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("cause", ""))
    except ValueError:
        return ""


#: Told of a copy out that the limit cut: its source and what :func:`unpack` did.
CutCopy = Callable[[str, "Unpacked"], None]


async def copy_out(container: str, source: str, target: Path, *, strip: int, max_bytes: int, on_cut: CutCopy) -> None:
    """``source`` out of ``container`` into ``target``: the engine's tar stream (``podman cp CONTAINER:SOURCE -``),
    extracted as it comes (:func:`unpack`), at most ``max_bytes``; a copy the limit cut is told to ``on_cut``."""
    reading, writing = os.pipe()
    stream, sink = os.fdopen(reading, "rb"), os.fdopen(writing, "wb")
    unpacking = asyncio.ensure_future(
        asyncio.to_thread(_unpack_then_close, stream, target, strip=strip, max_bytes=max_bytes, max_read=max_bytes * _COPY_READ_FACTOR)
    )
    try:
        failed = await _feed(container, source, sink, unpacking)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(unpacking)  # the reader sees the stream end once the pipe is closed
    done = await unpacking
    if failed is not None and not done.stopped_early:
        raise RuntimeError(f"copying {source} out of the container failed: {failed}")
    if done.dropped_files or done.stopped_early:
        on_cut(source, done)


async def _feed(container: str, source: str, sink: IO[bytes], unpacking: asyncio.Future[Unpacked]) -> str | None:
    """The engine's archive of ``source`` written into ``sink`` as it comes, until its end or until the
    reader stops; ``sink`` closed in every case. Returns why the engine refused, if it did."""
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.connect_write_pipe(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), sink)
    except BaseException:
        sink.close()
        raise
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    finished = False
    try:
        route = f"/containers/{segment(container)}/archive"
        async with engine_stream("GET", route, params={"path": source}, timeout=STATE_CALL_TIMEOUT_SEC) as response:
            if response.status_code != 200:
                await response.aread()
                return str(engine_error(response, "podman cp"))
            async for chunk in response.aiter_raw():
                if unpacking.done():
                    return None  # read as far as a copy reads
                writer.write(chunk)
                try:
                    await writer.drain()
                except ConnectionError:
                    return None  # the reader stopped
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()  # what is written has reached the pipe
        finished = True
        return None
    finally:
        if not finished:
            transport.abort()


def _unpack_then_close(stream: IO[bytes], target: Path, **limits: int) -> Unpacked:
    """:func:`unpack`, then the read end closed: a writer still writing learns the reader stopped."""
    try:
        return unpack(stream, target, **limits)
    finally:
        stream.close()


async def copy_file_out(container: str, source: str, target: Path, *, max_bytes: int, on_cut: CutCopy) -> None:
    """The regular file ``source`` out of ``container`` as ``target`` (:func:`copy_out`, then moved into place)."""
    with tempfile.TemporaryDirectory(dir=target.parent if target.parent.is_dir() else None) as scratch:
        await copy_out(container, source, Path(scratch), strip=0, max_bytes=max_bytes, on_cut=on_cut)
        copied = [p for p in Path(scratch).iterdir() if p.is_file() and not p.is_symlink()]
        if len(copied) != 1:
            raise FileNotFoundError(f"{source} is not a regular file in the container.")
        target.parent.mkdir(parents=True, exist_ok=True)
        copied[0].replace(target)


def pack(source: Path, target: PurePosixPath, into: IO[bytes]) -> None:
    """An archive that ``podman cp - CONTAINER:/`` extracts as ``target`` (a file or a tree), owned by root.

    Every parent of ``target`` is an explicit directory entry, so nothing needs to exist
    in the container beforehand. Links in ``source`` stay links.
    """

    def as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
        member.uid = member.gid = 0
        member.uname = member.gname = "root"
        return member

    with tarfile.open(fileobj=into, mode="w") as archive:
        relative = PurePosixPath(*target.parts[1:])
        for parent in reversed(relative.parents[:-1]):
            directory = tarfile.TarInfo(str(parent))
            directory.type, directory.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(as_root(directory))
        archive.add(str(source), arcname=str(relative), recursive=True, filter=as_root)


def unpack(archive_file: IO[bytes], target: Path, *, strip: int = 0, max_bytes: int | None = None, max_read: int | None = None) -> Unpacked:
    """Extract regular files and directories into ``target`` (see the module docstring).

    ``strip`` drops that many leading name components (``podman cp`` names a copied
    directory's entries after the directory). Existing files are overwritten, never
    followed: a name whose target or parent is not a plain file or directory is skipped.
    At most ``max_bytes`` of file data are written; files past it are dropped and counted,
    reading on through the stream up to ``max_read`` bytes of it.
    """
    done = Unpacked()
    target.mkdir(parents=True, exist_ok=True)
    stream = _Counted(archive_file, max_read)
    root = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
            for member in _members(archive, done):
                _extract(archive, member, root, strip, max_bytes, done)
        _drain(archive_file)
    except _ReadLimit:
        done.stopped_early = True
        done.skip(f"the rest of the archive (read {stream.count // (1024 * 1024)} MiB of it, as far as a copy reads)")
    except tarfile.ReadError as error:  # nothing came (the copy failed: its caller says why)
        done.skip(f"the archive ({error})")
    finally:
        os.close(root)
    if done.skipped_count:
        logger.warning(f"Copying out of the container into {target}: skipped {done.skipped_count} entries: {done.skipped[:5]}")
    return done


def _drain(stream: IO[bytes], limit: int = _CHUNK) -> None:
    """Read what follows tar's end marker (its padding), so the writer is not cut off mid-write."""
    read = 0
    while read < limit and (chunk := stream.read(64 * 1024)):
        read += len(chunk)


def _extract(archive: tarfile.TarFile, member: tarfile.TarInfo, root: int, strip: int, max_bytes: int | None, done: Unpacked) -> None:
    parts = PurePosixPath(member.name).parts[strip:]
    name = "/".join(parts)
    refusal = _refusal(member, parts)
    if refusal is None and member.isfile() and max_bytes is not None and done.bytes + member.size > max_bytes:
        done.drop(member.size)
        refusal = f"over the {max_bytes // (1024 * 1024)} MiB copy limit"
    if refusal:
        if parts:
            done.skip(f"{name} ({refusal})")
        return
    try:
        if member.isdir():
            os.close(_make_dirs(root, parts))
        else:
            parent = _make_dirs(root, parts[:-1])
            try:
                _write(parent, parts[-1], archive.extractfile(member), member.mode)
            except _ReadLimit:
                os.unlink(parts[-1], dir_fd=parent)  # cut short: not kept as if whole
                done.drop(member.size)
                raise
            finally:
                os.close(parent)
            done.bytes += member.size
        done.written += 1
    except (OSError, tarfile.TarError) as error:
        done.skip(f"{name} ({getattr(error, 'strerror', None) or error})")


def _members(archive: tarfile.TarFile, done: Unpacked):
    """The archive's members, ending quietly where the archive is cut short (a copy stopped at its limit)."""
    try:
        yield from archive
    except (tarfile.TarError, EOFError) as error:
        done.stopped_early = True
        done.skip(f"the rest of the archive ({error})")


def _refusal(member: tarfile.TarInfo, parts: tuple[str, ...]) -> str | None:
    if not parts:
        return "the archive's root" if member.isdir() else "an empty name"
    if member.name.startswith("/") or any(p in ("..", "") for p in parts) or "\0" in member.name:
        return "not a plain relative name"
    if member.issym() or member.islnk():
        return "a link: links are not copied out"
    if not (member.isfile() or member.isdir()):
        return "not a regular file or directory"
    return None


def _make_dirs(root: int, parts: tuple[str, ...]) -> int:
    """Walk (creating) ``parts`` below ``root`` without following links; an fd of the last one (or ``root``'s dup)."""
    current = os.dup(root)
    for part in parts:
        try:
            os.mkdir(part, 0o755, dir_fd=current)
        except FileExistsError:
            pass
        try:
            following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current)
        finally:
            os.close(current)
        current = following
    return current


def _write(parent: int, name: str, source: IO[bytes] | None, mode: int) -> None:
    try:
        existing = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        existing = None
    if existing is not None:
        if not stat.S_ISREG(existing.st_mode):
            raise OSError(f"{name} exists and is not a regular file")
        os.unlink(name, dir_fd=parent)  # replaced, never written through (it could be a hard link)
    descriptor = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, (mode & 0o777) | 0o600, dir_fd=parent)
    with os.fdopen(descriptor, "wb") as out:
        while source is not None and (chunk := source.read(_CHUNK)):
            out.write(chunk)
