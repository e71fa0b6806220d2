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
* an added or changed ``sitecustomize.py`` or ``usercustomize.py`` and ``.pth`` file with an
  ``import`` line, which Python runs at every start, in a library folder or a user's site folder
  (``~/.local/lib/python3.X/site-packages``), any change to Debian's Python settings
  (``/etc/python3.X/sitecustomize.py``), and an added ``pythonXY.zip`` in a library folder, where
  Python looks for its standard library first;
* a link of ``/etc/alternatives`` added or re-pointed (``awk``, ``editor``, ``python``: what
  ``/usr/bin/awk`` runs);
* a module added to the working folder (where ``test.sh`` starts) under the name of one of the
  image's Python standard library (``/app/json.py``, ``/app/json/__init__.py``): ``python3 -c``
  and ``python3 -m`` started there import it instead.

Programs and libraries the agent *added* (a package it installed) are not named: they change
nothing the image's own commands do. Nor is a change whose bytes dpkg's records say its package
installed (:mod:`.package_records`), nor one whose bytes pip's records name, nor a link
re-pointed to such a file: an upgraded library, a program a package adds earlier on ``PATH``,
setuptools' ``distutils-precedence.pth``. What this cannot see is in the README ("Not covered").
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from prefect_harbor.sandbox.container_view import changes, is_folder, list_inside, lstat_inside, open_inside, readlink_inside
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
#: Debian's Python settings: ``/etc/python3.11/sitecustomize.py``, which ``/usr/lib/python3.11/sitecustomize.py`` links to.
PYTHON_SETTINGS = re.compile(r"/etc/python3[^/]*(/.*)?")
#: A user's own site folder, which Python reads (its ``.pth`` files, ``usercustomize``) at every start.
USER_SITE = re.compile(r"/(root|home/[^/]+)/\.local/lib/python3[^/]*/site-packages(/.*)?")
#: A standard library's folder: ``python3.11`` (not ``python3``, Debian's shared dist-packages).
STANDARD_LIBRARY = re.compile(r"python3\.\d+")
#: A ``.pth`` line Python executes (``site`` runs the lines that start so).
PTH_CODE = re.compile(rb"^import[ \t]", re.MULTILINE)
#: A ``.pth`` file larger than this is not read: it is named as code.
PTH_BYTES = 1024 * 1024
#: Debian's alternatives: links the image's programs go through (``/usr/bin/awk`` → ``/etc/alternatives/awk`` → ``mawk``).
ALTERNATIVES = "/etc/alternatives"
#: At most this many changes are named one by one; the rest are counted.
NAMED = 12

_VERBS = {"C": "changed", "D": "deleted", "A": "added"}


def _under(path: str, folders: Iterable[str]) -> bool:
    return any(path == folder or path.startswith(folder + "/") for folder in folders)


def _watched(path: str) -> bool:
    return _under(path, (*PROGRAM_FOLDERS, *LIBRARY_FOLDERS, *LOADER_SETTINGS, ALTERNATIVES)) or bool(PYTHON_SETTINGS.fullmatch(path) or USER_SITE.fullmatch(path))


def _runs_code(root: Path, path: str) -> bool:
    """Whether the ``.pth`` file at ``path`` holds a line Python executes (or cannot be read whole)."""
    handle = open_inside(root, path)
    if handle is None:
        return False
    with os.fdopen(handle, "rb") as file:
        content = file.read(PTH_BYTES + 1)
    return len(content) > PTH_BYTES or PTH_CODE.search(content) is not None


@dataclass
class ProgramChanges:
    """What :func:`program_changes` found: each change in a short line, and how many were not named."""

    lines: list[str] = field(default_factory=list)
    unnamed: int = 0
    #: Every deleted path seen (a later verification names only new ones).
    deleted: set[str] = field(default_factory=set)
    #: Every file of the image the agent changed (``C``) or added (``A``), wherever it is: what
    #: :func:`used_changes` compares the verifier's opened files with.
    kinds: dict[str, str] = field(default_factory=dict)

    def add(self, line: str) -> None:
        if len(self.lines) < NAMED:
            self.lines.append(line)
        else:
            self.unnamed += 1

    def findings(self) -> list[str]:
        more = [f"and {self.unnamed} more changed programs or libraries"] if self.unnamed else []
        return [*self.lines, *more]


async def program_changes(
    container: str, root: Path, *, workdir: str = "/", since_ns: int | None = None, seen_deleted: frozenset[str] = frozenset()
) -> ProgramChanges:
    """The changes named in the module docstring, in the running ``container`` whose root file
    system the host sees at ``root`` and whose commands start in ``workdir``. ``since_ns``: only
    changes made after that time (a later step's verification, in a multi-step task: what the
    verifiers before it changed is not the agent's); ``seen_deleted``: deletions already reported."""
    found, records = ProgramChanges(), PackageRecords(root)
    standard: set[str] | None = None
    async for kind, path in changes(container, lambda _: True):
        if kind != "D":
            found.kinds[path] = kind
        if not (_watched(path) or working_folder_module(path, workdir) is not None):
            continue
        if kind == "D":
            found.deleted.add(path)
            if path in seen_deleted:
                continue
            now = None
        else:
            now = lstat_inside(root, path)
            if is_folder(now) or (since_ns is not None and now is not None and now.st_ctime_ns <= since_ns):
                continue
        if not _watched(path):  # a module in the working folder
            standard = standard_modules(root) if standard is None else standard
            if kind == "A" and (module := working_folder_module(path, workdir)) in standard:
                found.add(f"added {path}, which python3 -c and -m started in {workdir} import instead of the standard library's {module}")
            continue
        if (line := finding(kind, path, root)) and not (kind != "D" and explained_by_package(path, root, records)):
            found.add(line)
    return found


def working_folder_module(path: str, workdir: str) -> str | None:
    """The module name ``path`` would be imported as from ``workdir`` (``name.py``, ``name/__init__.py``), or None."""
    relative = PurePosixPath(path).relative_to(workdir).parts if PurePosixPath(path).is_relative_to(workdir) else ()
    if len(relative) == 1 and relative[0].endswith(".py"):
        return relative[0].removesuffix(".py")
    if len(relative) == 2 and relative[1] == "__init__.py":
        return relative[0]
    return None


def standard_modules(root: Path) -> set[str]:
    """The top-level module names of the image's Python standard libraries (``/usr/lib/python3.X``,
    ``/usr/local/lib/python3.X``, their ``lib-dynload``): what a module of the same name shadows."""
    names: set[str] = set()
    for prefix in ("/usr/lib", "/usr/local/lib"):
        for library in (f"{prefix}/{name}" for name in list_inside(root, prefix) if STANDARD_LIBRARY.fullmatch(name)):
            for name in list_inside(root, library):
                if name.endswith(".py"):
                    names.add(name.removesuffix(".py"))
                elif lstat_inside(root, f"{library}/{name}/__init__.py") is not None:
                    names.add(name)
            names.update(name.split(".", 1)[0] for name in list_inside(root, f"{library}/lib-dynload") if name.endswith(".so"))
    return names


def finding(kind: str, path: str, root: Path) -> str | None:
    name = PurePosixPath(path).name
    if _under(path, LOADER_SETTINGS):
        return f"{_VERBS[kind]} {path} (the dynamic loader's settings)"
    if PYTHON_SETTINGS.fullmatch(path):
        return f"{_VERBS[kind]} {path} (Python's settings, read at every start)"
    python_site = _under(path, LIBRARY_FOLDERS) or USER_SITE.fullmatch(path)
    if kind != "D" and python_site and name in STARTUP_HOOKS:
        return f"{_VERBS[kind]} {path} (Python runs it at every start)"
    if kind != "D" and python_site and name.endswith(".pth") and _runs_code(root, path):
        return f"{_VERBS[kind]} {path} (Python runs its import line at every start)"
    if USER_SITE.fullmatch(path):
        return None  # a user's own packages: what they change is theirs, as an added library is
    if _under(path, (ALTERNATIVES,)):
        if kind == "D":
            return f"deleted {path}"
        target = readlink_inside(root, path)
        return f"{'re-pointed' if kind == 'C' else 'added'} {path} to {target}" if target is not None else f"{_VERBS[kind]} {path}, no longer a link"
    if kind == "A":
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


#: Where the verifier's own files are, and the task's work (what the tests are there to run).
_NOT_THE_IMAGES = ("/tests", "/logs", "/proc", "/dev", "/sys")
#: Files a program loads as code: shared objects, Python's modules and archives, shell and Perl sources.
#: Not Python's ``.pyc`` caches: any Python program the agent ran rewrites them, beside unchanged sources.
CODE = re.compile(r".*\.(so(\.\d+)*|py|pth|zip|pm|pl|sh)")


def used_changes(opened: dict[str, bool], found: ProgramChanges, root: Path, workdir: str) -> list[str]:
    """Files of the image the agent changed that the verifier then ran or loaded as code (``opened``:
    path -> executed, from :mod:`.opened_files`), wherever they are; not those of the working folder
    (the task's own code, which the tests run on purpose), those already named, nor a package's."""
    named = {word.rstrip(",") for line in found.lines for word in line.split()}
    records, used, device = PackageRecords(root), [], root.stat().st_dev
    for path, executed in sorted(opened.items()):
        if found.kinds.get(path) != "C" or not (executed or CODE.fullmatch(PurePosixPath(path).name)):
            continue
        here = lstat_inside(root, path)
        if here is None or not stat.S_ISREG(here.st_mode) or here.st_dev != device:
            continue  # not the container's own file: a folder the sandbox mounts there (a workflow's prepared environment)
        if _under(path, (*_NOT_THE_IMAGES, *([workdir] if workdir != "/" else []))) or path in named or explained_by_package(path, root, records):
            continue
        used.append(f"the verifier {'ran' if executed else 'loaded'} {path}, which the agent changed")
    return used

