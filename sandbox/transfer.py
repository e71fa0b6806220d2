"""Files in and out of a container as tar streams made and read by trusted code only.

Both directions go through ``podman cp`` (podman's own copier, which resolves paths inside
the container's root), never through a ``tar`` binary of the container's: an agent that is
root in its container can replace that binary and forge the archive.

On the host, what comes out is extracted by :func:`unpack`, which writes regular files and
directories only, under plain relative names (no absolute names, no ``..``), and never
through a link: links, hard links, devices and FIFOs are skipped and logged. So whatever an
agent leaves in ``/logs`` -- symlink chains long enough to fool ``os.path.realpath``
(CVE-2025-4517), hard links, forged members -- cannot make the host write or read outside
the target. The bytes written are capped, so a sparse or huge file cannot fill the host's disk.
"""

from __future__ import annotations

import logging
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024


@dataclass
class Unpacked:
    """What :func:`unpack` did: the members written and the ones it refused."""

    written: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


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


def unpack(archive_file: IO[bytes], target: Path, *, strip: int = 0, max_bytes: int | None = None) -> Unpacked:
    """Extract regular files and directories into ``target`` (see the module docstring).

    ``strip`` drops that many leading name components (``podman cp`` names a copied
    directory's entries after the directory). Existing files are overwritten, never
    followed: a name whose target or parent is not a plain file or directory is skipped.
    """
    done = Unpacked()
    target.mkdir(parents=True, exist_ok=True)
    root = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with tarfile.open(fileobj=archive_file, mode="r|") as archive:
            for member in _members(archive, done):
                parts = PurePosixPath(member.name).parts[strip:]
                name = "/".join(parts)
                refusal = _refusal(member, parts)
                if refusal is None and member.isfile() and max_bytes is not None and done.bytes + member.size > max_bytes:
                    refusal = f"over the {max_bytes // (1024 * 1024)} MiB copy limit"
                if refusal:
                    if parts:
                        done.skipped.append(f"{name} ({refusal})")
                    continue
                try:
                    if member.isdir():
                        _make_dirs(root, parts)
                    else:
                        parent = _make_dirs(root, parts[:-1])
                        try:
                            _write(parent, parts[-1], archive.extractfile(member), member.mode)
                        finally:
                            os.close(parent)
                        done.bytes += member.size
                    done.written += 1
                except (OSError, tarfile.TarError) as error:
                    done.skipped.append(f"{name} ({getattr(error, 'strerror', None) or error})")
    finally:
        os.close(root)
    if done.skipped:
        logger.warning(f"Copying out of the container into {target}: skipped {len(done.skipped)} entries: {done.skipped[:5]}")
    return done


def _members(archive: tarfile.TarFile, done: Unpacked):
    """The archive's members, ending quietly where the archive is cut short (a copy stopped at its limit)."""
    try:
        yield from archive
    except (tarfile.TarError, EOFError) as error:
        done.skipped.append(f"the rest of the archive ({error})")


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
