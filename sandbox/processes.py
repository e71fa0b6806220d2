"""Find and kill process trees through /proc, so a timed-out exec leaves nothing behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def parent_map() -> dict[int, int]:
    """Map every visible pid to its parent pid."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        # The command name sits in parentheses and may contain spaces: split after it.
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), nearest first."""
    children: dict[int, list[int]] = {}
    for child, parent in parent_map().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child in children.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group (if it leads one) and all its descendants.

    Descendants are collected before anything is killed, since killing a parent first
    would re-parent its children out of reach.
    """
    tree = [pid, *descendants(pid)]
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
