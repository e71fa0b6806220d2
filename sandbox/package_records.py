"""Whether a changed file in a container is what a package manager (dpkg or pip) put there.

A solution that installs a package (``apt-get install iproute2``, ``pip install setuptools``)
adds programs that may come before the image's on ``PATH``, changes libraries and adds ``.pth``
files: to the tamper evidence (:mod:`.program_changes`) that looks like an agent's forgery.
dpkg records each installed file's MD5 in ``/var/lib/dpkg/info/<package>.md5sums``; pip records
each file's SHA-256 in its distribution's ``*.dist-info/RECORD``, beside the files in their
site folder; a file whose bytes match its record is the package's. The records are the
container's, so an agent that is root there can forge them too: this removes false alarms, it is
no wall (the README's "Not covered" says so). dpkg records no checksum of a link (``/sbin/ip`` →
``/bin/ip``): a link is its package's when the package lists it (``<package>.list``) and it
leads to a file that is its package's.

Everything is read from the host's view of the container's root file system, never following a
link (:mod:`.container_view`).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from prefect_harbor.sandbox.container_view import list_inside, open_inside, readlink_inside

DPKG_INFO = "/var/lib/dpkg/info"
#: A record file larger than this is not read (a package's is a few KiB; libc's about 20 KiB).
RECORD_BYTES = 4 * 1024 * 1024
#: A file larger than this is not hashed: it is not explained.
HASHED_BYTES = 256 * 1024 * 1024
#: Folders Debian 12 merges into /usr: a record of bin/ip is the file /usr/bin/ip.
_MERGED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Links followed from a link to the file it leads to.
_LINKS_FOLLOWED = 8
#: Where pip's site folders are (``*`` one name each): the system's, ``/usr/local``'s and users' own.
SITE_FOLDERS = (
    "/usr/lib/python3/dist-packages",
    "/usr/lib/python3*/site-packages",
    "/usr/local/lib/python3*/dist-packages",
    "/usr/local/lib/python3*/site-packages",
    "/root/.local/lib/python3*/site-packages",
    "/home/*/.local/lib/python3*/site-packages",
)
#: At most this many distributions' records are read per container.
_DISTRIBUTIONS = 2000


def _aliases(path: str) -> list[str]:
    """``path`` and its other name under the merged /usr (a record names either)."""
    parts = PurePosixPath(path).parts
    if len(parts) > 2 and parts[1] == "usr" and parts[2] in _MERGED:
        return [path, "/" + "/".join(parts[2:])]
    if len(parts) > 1 and parts[1] in _MERGED:
        return [path, "/usr" + path]
    return [path]


def _read(root: Path, path: str, limit: int) -> bytes | None:
    handle = open_inside(root, path)
    if handle is None:
        return None
    try:
        with os.fdopen(handle, "rb") as file:
            return file.read(limit + 1)
    except OSError:
        return None


def _digest(root: Path, path: str, algorithm: str) -> bytes | None:
    """``path``'s digest (by ``algorithm``: ``md5``, ``sha256``), or None if it is no regular file or too large."""
    handle = next((h for name in _aliases(path) if (h := open_inside(root, name)) is not None), None)
    if handle is None:
        return None
    digest, read = hashlib.new(algorithm, usedforsecurity=False), 0
    try:
        with os.fdopen(handle, "rb") as file:
            while chunk := file.read(1 << 20):
                read += len(chunk)
                if read > HASHED_BYTES:
                    return None
                digest.update(chunk)
    except OSError:
        return None
    return digest.digest()


def site_folders(root: Path) -> Iterator[str]:
    """Each of :data:`SITE_FOLDERS` that exists in the container."""
    for pattern in SITE_FOLDERS:
        found = [""]
        for part in PurePosixPath(pattern).parts[1:]:
            found = [f"{folder}/{name}" for folder in found for name in (list_inside(root, folder or "/") if "*" in part else [part]) if fnmatch.fnmatchcase(name, part)]
        yield from (folder for folder in found if list_inside(root, folder))


class PackageRecords:
    """dpkg's and pip's recorded checksums in one container, read once, on first need."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sums: dict[str, tuple[str, str]] = {}
        self._listed: dict[str, str] = {}
        #: pip's: path -> (urlsafe base64 SHA-256 without padding, "pip:<distribution>").
        self._pip: dict[str, tuple[str, str]] = {}
        self._loaded = False

    def _records_of(self, suffix: str) -> Iterator[tuple[str, str]]:
        """``(package, line)`` for each line of every ``*<suffix>`` record file."""
        for name in list_inside(self.root, DPKG_INFO):
            if not name.endswith(suffix):
                continue
            content = _read(self.root, f"{DPKG_INFO}/{name}", RECORD_BYTES)
            if content is None or len(content) > RECORD_BYTES:
                continue
            package = name.removesuffix(suffix).split(":", 1)[0]
            for line in content.decode(errors="surrogateescape").splitlines():
                yield package, line

    def _load(self) -> None:
        for package, line in self._records_of(".md5sums"):
            checksum, _, relative = line.partition("  ")
            if len(checksum) == 32 and relative:
                self._sums["/" + relative.lstrip("/")] = (checksum, package)
        for package, line in self._records_of(".list"):
            if line.startswith("/"):
                self._listed[line] = package
        self._load_pip()
        self._loaded = True

    def _load_pip(self) -> None:
        """Each ``*.dist-info/RECORD`` line ``path,sha256=<digest>,size`` (paths relative to the site folder)."""
        read = 0
        for site in site_folders(self.root):
            for distribution in list_inside(self.root, site):
                if not distribution.endswith(".dist-info") or (read := read + 1) > _DISTRIBUTIONS:
                    continue
                content = _read(self.root, f"{site}/{distribution}/RECORD", RECORD_BYTES)
                if content is None or len(content) > RECORD_BYTES:
                    continue
                name = "pip:" + distribution.removesuffix(".dist-info").rpartition("-")[0]
                for line in content.decode(errors="surrogateescape").splitlines():
                    relative, _, rest = line.partition(",")
                    algorithm, _, checksum = rest.partition(",")[0].partition("=")
                    if algorithm == "sha256" and checksum and relative:
                        self._pip[posixpath.normpath(posixpath.join(site, relative))] = (checksum, name)

    def owner(self, path: str, _links: int = _LINKS_FOLLOWED) -> str | None:
        """The package whose recorded checksum ``path``'s bytes match (a link: that lists it and
        whose file it leads to), or None."""
        if not self._loaded:
            self._load()
        target = readlink_inside(self.root, path)
        if target is not None:
            package = next((self._listed[name] for name in _aliases(path) if name in self._listed), None)
            leads_to = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            return package if package is not None and _links > 0 and self.owner(leads_to, _links - 1) is not None else None
        for name in _aliases(path):
            if (record := self._sums.get(name)) is not None and (digest := _digest(self.root, path, "md5")) is not None:
                if digest.hex() == record[0]:
                    return record[1]
            if (record := self._pip.get(name)) is not None and (digest := _digest(self.root, path, "sha256")) is not None:
                if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == record[0]:
                    return record[1]
        return None
