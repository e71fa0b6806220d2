"""Clean up after sandboxes whose owning process died without stopping them.

``--die-with-parent`` already makes the kernel kill a sandbox when its owner dies; what
remains is its private tree on disk, and -- should a sandbox ever outlive its owner --
its processes. A sweep reaps at start; ``prefect-harbor cleanup`` does it on demand.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from prefect_harbor.sandbox.processes import kill_tree


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_bwrap(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"bwrap")
    except OSError:
        return False


def reap_stale_sandboxes(sandboxes_dir: Path) -> list[Path]:
    """Kill and remove every sandbox under ``sandboxes_dir`` whose owner is gone."""
    reaped: list[Path] = []
    if not sandboxes_dir.is_dir():
        return reaped
    for state_dir in sandboxes_dir.iterdir():
        try:
            info = json.loads((state_dir / "sandbox.json").read_text())
        except (OSError, ValueError):
            continue  # still starting, or not one of ours
        if _alive(int(info["owner_pid"])):
            continue
        for pid in (int(info["init_pid"]), int(info["bwrap_pid"])):
            if _alive(pid) and (pid == int(info["init_pid"]) or _is_bwrap(pid)):
                kill_tree(pid)
        shutil.rmtree(state_dir, ignore_errors=True)
        reaped.append(state_dir)
    return reaped
