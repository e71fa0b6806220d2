"""Which of the agent's changes to its container could change what a verifier's commands do.

A shared verifier runs ``bash``, Harbor's ``rm`` and ``chmod``, and whatever ``test.sh`` calls
(``python3``, ``pytest``, ``grep``), all from the agent's container. So before the tests run,
the sandbox compares the container with its image (``podman diff``) where those commands come
from, and names what it finds:

* a program that existed in the image and was changed or deleted, in any folder of the default
  ``PATH`` (``/usr/local/sbin`` … ``/bin``);
* a program added to an earlier ``PATH`` folder that shadows one of a later folder
  (``/usr/local/bin/bash`` before ``/usr/bin/bash``);
* a library or interpreter file that existed in the image and was changed or deleted under
  ``/lib*``, ``/usr/lib*`` or ``/usr/local/lib*`` (shared objects, the dynamic loader, Python's
  standard library and site-packages, Perl's and Node's modules);
* any change to the dynamic loader's settings: ``/etc/ld.so.preload``, ``/etc/ld.so.conf`` and
  ``/etc/ld.so.conf.d/`` (not ``/etc/ld.so.cache``, which every package install rewrites);
* an added ``sitecustomize.py`` or ``usercustomize.py``, which Python runs at every start, and an
  added ``pythonXY.zip`` in a library folder, where Python looks for its standard library first;
* a link of ``/etc/alternatives`` added or re-pointed (``awk``, ``editor``, ``python``: what
  ``/usr/bin/awk`` runs).

Programs and libraries the agent *added* (a package it installed) are not named: they change
nothing the image's own commands do. Nor is a change whose bytes dpkg's records say its package
installed (:mod:`.package_records`), nor a link re-pointed to such a file: an upgraded library,
a program a package adds earlier on ``PATH``. What this cannot see is in the README ("Not covered").
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from prefect_harbor.sandbox.container_view import changes, is_folder, lstat_inside, readlink_inside
from prefect_harbor.sandbox.package_records import PackageRecords

#: The default PATH's folders, in PATH's order: a program found in an earlier one wins.
PROGRAM_FOLDERS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: Where the programs' libraries and the interpreters' modules live.
LIBRARY_FOLDERS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/local/lib", "/usr/local/lib64")
#: The dynamic loader's settings: any change to these is named.
LOADER_SETTINGS = ("/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
#: Files Python runs at every interpreter start when they appear on its path.
STARTUP_HOOKS = ("sitecustomize.py", "usercustomize.py")
#: The archive Python reads its standard library from before the library folder (``sys.path[0]`` of an interpreter).
PYTHON_ZIP = re.compile(r"python3\d*\.zip")
#: Debian's alternatives: links the image's programs go through (``/usr/bin/awk`` → ``/etc/alternatives/awk`` → ``mawk``).
ALTERNATIVES = "/etc/alternatives"
#: At most this many changes are named one by one; the rest are counted.
NAMED = 12

_VERBS = {"C": "changed", "D": "deleted", "A": "added"}


def _under(path: str, folders: Iterable[str]) -> bool:
    return any(path == folder or path.startswith(folder + "/") for folder in folders)


def _watched(path: str) -> bool:
    return _under(path, (*PROGRAM_FOLDERS, *LIBRARY_FOLDERS, *LOADER_SETTINGS, ALTERNATIVES))


@dataclass
class ProgramChanges:
    """What :func:`program_changes` found: each change in a short line, and how many were not named."""

    lines: list[str] = field(default_factory=list)
    unnamed: int = 0
    #: Every deleted path seen (a later verification names only new ones).
    deleted: set[str] = field(default_factory=set)

    def add(self, line: str) -> None:
        if len(self.lines) < NAMED:
            self.lines.append(line)
        else:
            self.unnamed += 1

    def findings(self) -> list[str]:
        more = [f"and {self.unnamed} more changed programs or libraries"] if self.unnamed else []
        return [*self.lines, *more]


async def program_changes(container: str, root: Path, *, since_ns: int | None = None, seen_deleted: frozenset[str] = frozenset()) -> ProgramChanges:
    """The changes named in the module docstring, in the running ``container`` whose root file
    system the host sees at ``root``. ``since_ns``: only changes made after that time (a later
    step's verification, in a multi-step task: what the verifiers before it changed is not the
    agent's); ``seen_deleted``: deletions already reported."""
    found, records = ProgramChanges(), PackageRecords(root)
    async for kind, path in changes(container, _watched):
        if kind == "D":
            found.deleted.add(path)
            if path in seen_deleted:
                continue
            now = None
        else:
            now = lstat_inside(root, path)
            if is_folder(now) or (since_ns is not None and now is not None and now.st_ctime_ns <= since_ns):
                continue
        if (line := finding(kind, path, root)) and not (kind != "D" and explained_by_package(path, root, records)):
            found.add(line)
    return found


def finding(kind: str, path: str, root: Path) -> str | None:
    name = PurePosixPath(path).name
    if _under(path, LOADER_SETTINGS):
        return f"{_VERBS[kind]} {path} (the dynamic loader's settings)"
    if _under(path, (ALTERNATIVES,)):
        if kind == "D":
            return f"deleted {path}"
        target = readlink_inside(root, path)
        return f"{'re-pointed' if kind == 'C' else 'added'} {path} to {target}" if target is not None else f"{_VERBS[kind]} {path}, no longer a link"
    if kind == "A":
        if name in STARTUP_HOOKS and _under(path, LIBRARY_FOLDERS):
            return f"added {path} (Python runs it at every start)"
        if PYTHON_ZIP.fullmatch(name) and _under(path, LIBRARY_FOLDERS):
            return f"added {path} (Python looks for its standard library there first)"
        if _under(path, PROGRAM_FOLDERS) and (shadowed := _shadowed(path, root)):
            return f"added {path}, which comes before {shadowed} on PATH"
        return None
    return f"{_VERBS[kind]} {path}"


def explained_by_package(path: str, root: Path, records: PackageRecords) -> bool:
    """Whether dpkg's records say a package put ``path`` there as it is (an alternative: where it now points)."""
    if _under(path, LOADER_SETTINGS):
        return False
    if _under(path, (ALTERNATIVES,)):
        target = readlink_inside(root, path)
        return target is not None and records.owner(posixpath.normpath(posixpath.join(ALTERNATIVES, target))) is not None
    return records.owner(path) is not None


def _shadowed(path: str, root: Path) -> str | None:
    """The program of a later PATH folder that ``path`` (in an earlier one) hides, if any."""
    folder, name = str(PurePosixPath(path).parent), PurePosixPath(path).name
    if folder not in PROGRAM_FOLDERS:
        return None
    for later in PROGRAM_FOLDERS[PROGRAM_FOLDERS.index(folder) + 1 :]:
        if lstat_inside(root, f"{later}/{name}") is not None:
            return f"{later}/{name}"
    return None
