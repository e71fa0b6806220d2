"""Who owns what the sandbox leaves on the host: a process, named by its pid and start time.

A container's owner label, a relay's admission and the engine service's folder all carry
:func:`owner_token`; :func:`owner_alive` tells the janitor whether that very process still
runs (a pid reused since is not it).
"""

from __future__ import annotations

import os


def start_time(pid: int) -> int | None:
    """When host process ``pid`` started (clock ticks after boot), or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return started_at(stat.read(4096).decode(errors="replace"))
    except (OSError, ValueError, IndexError):
        return None


def started_at(stat_line: str) -> int:
    """The start time in a ``/proc/PID/stat`` line: field 22, counted after the command's ``)``."""
    return int(stat_line[stat_line.rindex(")") + 2 :].split()[19])


def owner_token(pid: int | None = None) -> str:
    """``<pid>.<start time>`` of this process (or ``pid``): unique on the host while it runs."""
    pid = pid or os.getpid()
    return f"{pid}.{start_time(pid)}"


def owner_alive(token: str) -> bool:
    pid, _, started = token.partition(".")
    return pid.isdigit() and (found := start_time(int(pid))) is not None and str(found) == started
