"""Process limits that hold host-wide: a fork loop in a trial or in a ``RUN`` step cannot take the host's pid space.

Each trial's containers have ``--pids-limit``, and a pod's cgroup gets the same limit for all of
its services together. The trials at once times that limit must stay within
:func:`process_budget`, half the host's ``pid_max``: :func:`trial_pids_limit` gives the default
limit that fits, and refuses a configured one that does not. Image builds have no
``--pids-limit`` in podman 4.3: each build slot runs its ``RUN`` steps under a cgroup of its own
whose ``pids.max`` is the same limit.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from prefect_harbor.sandbox.engine import podman_sync

#: The most processes one trial may have, when the host's budget allows it.
DEFAULT_PIDS_LIMIT = 4096
#: Below this a default limit would break ordinary tasks (a build with make -j, a browser): refuse instead.
MIN_PIDS_LIMIT = 256
#: Where this project's cgroups live, under each controller's root.
CGROUP_NAME = "prefect-harbor"
_CGROUP_ROOT = Path("/sys/fs/cgroup")
logger = logging.getLogger(__name__)


class ProcessBudgetError(ValueError):
    """The configured process limit times the trials at once does not fit the host's budget."""


def pid_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def process_budget() -> int:
    """The processes all trials together may have: half the host's pid space, the rest is the host's."""
    return pid_max() // 2


def trial_pids_limit(configured: int | None, trials_at_once: int) -> int:
    """The per-trial limit: ``configured`` if ``trials_at_once`` of it fit the budget, else an error
    naming the fix; without one, the default or the share of the budget, whichever is smaller."""
    budget = process_budget()
    if configured is None:
        share = min(DEFAULT_PIDS_LIMIT, budget // trials_at_once)
        if share < MIN_PIDS_LIMIT:
            raise ProcessBudgetError(
                f"concurrency: {trials_at_once} trials at once leave each only {share} processes of this host's budget "
                f"({budget}, half of pid_max {pid_max()}); run fewer trials at once, or set environment.kwargs.pids_limit explicitly."
            )
        return share
    if configured < 1:
        raise ProcessBudgetError(f"environment.kwargs.pids_limit: {configured} must be at least 1.")
    if configured * trials_at_once > budget:
        raise ProcessBudgetError(
            f"environment.kwargs.pids_limit: {configured} processes per trial times {trials_at_once} trials at once is "
            f"{configured * trials_at_once}, over this host's budget of {budget} (half of pid_max {pid_max()}); lower pids_limit "
            f"to {budget // trials_at_once} or less, run fewer trials at once, or leave pids_limit empty to get the share that fits."
        )
    return configured


@cache
def _pids_hierarchy() -> Path | None:
    """The root of the cgroup hierarchy with the pids controller (v1: its own; v2: the unified one)."""
    if (_CGROUP_ROOT / "pids" / "pids.max").exists() or (_CGROUP_ROOT / "pids" / "cgroup.procs").exists():
        return _CGROUP_ROOT / "pids"
    if "pids" in _read(_CGROUP_ROOT / "cgroup.controllers").split():
        return _CGROUP_ROOT
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def limit_cgroup(relative: str, pids_max: int) -> bool:
    """Create the cgroup ``relative`` (under the pids hierarchy) with ``pids.max``; False where it cannot be."""
    root = _pids_hierarchy()
    if root is None:
        return False
    relative_path = Path(relative.strip("/"))
    path = root / relative_path
    try:
        path.mkdir(parents=True, exist_ok=True)
        if root == _CGROUP_ROOT:  # cgroup v2: each ancestor enables the controller for its children
            for ancestor in [root, *(root / p for p in reversed(relative_path.parents) if p != Path("."))]:
                if "pids" not in _read(ancestor / "cgroup.subtree_control").split():
                    (ancestor / "cgroup.subtree_control").write_text("+pids")
        (path / "pids.max").write_text(str(pids_max))
        return True
    except OSError as error:
        logger.debug(f"Could not limit cgroup {path}: {error}")
        return False


@cache
def cgroupfs_manager() -> bool:
    """Whether the engine manages cgroups as plain folders (where a path is a valid cgroup parent), not through systemd."""
    return podman_sync("info", "--format", "{{.Host.CgroupManager}}").text == "cgroupfs"


@cache
def _warned_once(what: str) -> None:
    logger.warning(what)


def build_cgroup_parent(slot: int, pids_max: int) -> list[str]:
    """``podman build`` options that run a build slot's ``RUN`` steps under ``pids_max`` processes.

    Buildah makes (and removes) each step's cgroup at the path it is given, so the limit is
    set one level up, on the slot's own cgroup, which outlives the steps.
    """
    slot_cgroup = f"{CGROUP_NAME}/build-{slot}"
    if not cgroupfs_manager() or not limit_cgroup(slot_cgroup, pids_max):
        _warned_once("Image builds run without a process limit: the engine does not manage cgroups as folders (cgroupfs), or the pids controller is not writable.")
        return []
    return ["--cgroup-parent", f"/{slot_cgroup}/step"]
