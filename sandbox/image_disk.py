"""The disk this project's images take stays bounded.

Two stores grow with every new task environment:

* **the builder's cache** (its layer store, its ``RUN --mount=type=cache`` folders and the base
  archives it is handed, under :func:`.builder.builder_home`). A cache: when it passes its cap
  (``PREFECT_HARBOR_BUILDER_CACHE_GB``, :data:`DEFAULT_CACHE_GB` by default) it is dropped whole
  and the next build starts cold. Checked before a build (at most every ten minutes in a process)
  and by ``prefect-harbor images prune``. Builds hold it shared, so it is never dropped under a
  running build: a check that finds one running waits for the next.
* **task images** in the host's storage (:data:`.images.IMAGE_REPOSITORY`). Each sweep marks the
  images it uses; ``prefect-harbor images prune`` removes those no sweep has used for a number
  of days (an image a container still uses stays). The stand-ins this project ships for bases it
  cannot pull are judged on their own number of days: they are costly to make again (a CPython
  compiled from source) and shared by every task built on them. A removed image is built again
  when a sweep needs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prefect_harbor.sandbox.engine import podman_sync
from prefect_harbor.sandbox.file_locks import polled_flock

CACHE_CAP_VARIABLE = "PREFECT_HARBOR_BUILDER_CACHE_GB"
DEFAULT_CACHE_GB = 20.0
#: The builder home's folders that are cache: everything in them can be made again.
CACHE_PARTS = ("storage", "tmp", "bases")
#: The label a task image carries naming its task; a shipped stand-in's reads ``stand-in for <base>``.
TASK_LABEL = "io.prefect-harbor.task"
STAND_IN_PREFIX = "stand-in for "
_CHECK_EVERY_SEC = 600.0
_LOCK_NAME = "cache.lock"
_last_check: float | None = None
_check_lock = threading.Lock()


def cache_cap_bytes() -> int:
    """The builder cache's cap, from ``PREFECT_HARBOR_BUILDER_CACHE_GB`` (gigabytes, 10^9 bytes)."""
    raw = os.environ.get(CACHE_CAP_VARIABLE, "").strip()
    if not raw:
        return int(DEFAULT_CACHE_GB * 1e9)
    try:
        gigabytes = float(raw)
    except ValueError:
        gigabytes = -1.0
    if not gigabytes >= 0:  # also NaN
        raise ValueError(f"{CACHE_CAP_VARIABLE}={raw!r} is not a number of gigabytes: set it to one (e.g. 20), or unset it for {DEFAULT_CACHE_GB:g}.")
    return int(gigabytes * 1e9)


@dataclass(frozen=True)
class CacheCheck:
    """What a look at the builder's cache found and did."""

    size_bytes: int
    cap_bytes: int
    dropped: bool = False
    busy: bool = False  # a build held the cache: not measured, not dropped

    def describe(self) -> str:
        if self.busy:
            return "builder cache: a build is using it; not checked"
        verdict = "dropped (over its cap; the next build starts cold)" if self.dropped else "kept"
        return f"builder cache: {self.size_bytes / 1e9:.1f} GB of a {self.cap_bytes / 1e9:g} GB cap, {verdict}"


def cache_in_use(home: Path) -> contextlib.AbstractAsyncContextManager[None]:
    """A build's shared hold on the builder's cache, which is not dropped while anyone holds it."""
    return polled_flock(home / _LOCK_NAME, shared=True)


@contextlib.contextmanager
def _held_alone(home: Path) -> Iterator[bool]:
    """Whether the cache could be taken with no build holding it (and then it is, until the block ends)."""
    with (home / _LOCK_NAME).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_bytes(home: Path) -> int:
    """The disk the builder's cache takes (``du``: blocks, each hard-linked file once)."""
    parts = [str(home / part) for part in CACHE_PARTS if (home / part).exists()]
    if not parts:
        return 0
    done = subprocess.run(["du", "--summarize", "--total", "--block-size=1", "--one-file-system", *parts], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if not lines or not lines[-1].endswith("total"):
        raise RuntimeError(f"could not measure the builder's cache under {home}: {done.stderr.strip()[-500:]}")
    return int(lines[-1].split()[0])


def check_cache(home: Path, cap_bytes: int | None = None) -> CacheCheck:
    """Measure the builder's cache and drop it whole when it is over ``cap_bytes``."""
    cap = cache_cap_bytes() if cap_bytes is None else cap_bytes
    with _held_alone(home) as alone:
        if not alone:
            return CacheCheck(0, cap, busy=True)
        size = cache_bytes(home)
        if size <= cap:
            return CacheCheck(size, cap)
        for part in CACHE_PARTS:
            _remove(home / part)
        return CacheCheck(size, cap, dropped=True)


def check_cache_if_due(home: Path) -> CacheCheck | None:
    """:func:`check_cache`, at most every ten minutes in this process (a build's first step)."""
    global _last_check
    with _check_lock:
        now = time.monotonic()
        if _last_check is not None and now - _last_check < _CHECK_EVERY_SEC:
            return None
        _last_check = now
    return check_cache(home)


def _remove(path: Path) -> None:
    """Remove a cache folder the builder's ids own (a rootless user needs its user namespace for that)."""
    if not path.exists():
        return
    if os.geteuid() == 0:
        shutil.rmtree(path)
    else:
        podman_sync("unshare", "rm", "-rf", "--one-file-system", "--", str(path), timeout=1800).check(f"removing {path}")


def use_marks(home: Path) -> Path:
    """Where a task image's last use is marked: one empty file per tag, its time the last use."""
    folder = home.parent / "image-use"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def mark_used(home: Path, tag: str) -> None:
    """Note that a sweep uses task image ``tag`` now."""
    mark = use_marks(home) / tag.rsplit(":", 1)[-1]
    mark.touch()
    os.utime(mark)


@dataclass(frozen=True)
class ImagePrune:
    """Task images removed (their tags) and those kept because a container uses them."""

    removed: list[str]
    in_use: list[str]
    kept: int

    def describe(self, unused_days: float) -> str:
        text = f"task images: {len(self.removed)} removed (no sweep used them in {unused_days:g} days), {self.kept} kept"
        return text + (f", {len(self.in_use)} still used by a container" if self.in_use else "")


def prune_task_images(
    home: Path, repository: str, unused_days: float, *, stand_in_unused_days: float | None = None, now: float | None = None
) -> ImagePrune:  # fmt: skip
    """Remove the images of ``repository`` that no sweep has used (nor been built) in ``unused_days``;
    shipped stand-ins in ``stand_in_unused_days`` (``unused_days`` when not given)."""
    listed = podman_sync("images", "--filter", f"reference={repository}", "--format", "json", timeout=300)
    listed.check("listing task images")
    marks, now = use_marks(home), time.time() if now is None else now
    stale: list[str] = []
    kept = 0
    for image in json.loads(listed.text or "[]"):
        stand_in = str((image.get("Labels") or {}).get(TASK_LABEL, "")).startswith(STAND_IN_PREFIX)
        days = stand_in_unused_days if stand_in and stand_in_unused_days is not None else unused_days
        for name in image.get("Names") or []:
            if not name.startswith(f"{repository}:"):
                continue
            mark = marks / name.rsplit(":", 1)[-1]
            last = max(float(image.get("Created") or 0), mark.stat().st_mtime if mark.exists() else 0.0)
            if now - last > days * 86400:
                stale.append(name)
            else:
                kept += 1
    if stale:
        podman_sync("rmi", *stale, timeout=1800)  # an image a container uses is refused; the rest go
    remaining = set(podman_sync("images", "--filter", f"reference={repository}", "--format", "{{.Repository}}:{{.Tag}}").text.split())
    removed = [name for name in stale if name not in remaining]
    for name in removed:
        (marks / name.rsplit(":", 1)[-1]).unlink(missing_ok=True)
    return ImagePrune(removed=removed, in_use=[name for name in stale if name in remaining], kept=kept)
