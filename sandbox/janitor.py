"""No container (or pod) outlives the process that started it.

Every container, and every pod of a multi-service task, is labelled with its owner: this process's pid and start time (so a
reused pid is not mistaken for the owner). Two mechanisms remove orphans:

* a **watchdog** per owner process, started with its first container: a small shell in a
  session of its own that ignores the terminal's and the worker's signals and blocks on a
  pipe from the owner. When the owner dies by any means, ``kill -9`` included, the pipe
  closes and the watchdog removes the owner's pods and containers, and withdraws its relays'
  admissions from the host's guard (:mod:`.firewall`), then exits;
* :func:`reap_orphans`, run at the start of every sweep and by ``prefect-harbor cleanup``,
  removes pods and containers whose owner is gone (for example after a reboot of the watchdog's host
  session), the guard's admissions of relays whose owner is gone, and the folders of engine
  services whose owner is gone (:mod:`.engine_service`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading

from prefect_harbor.sandbox import firewall
from prefect_harbor.sandbox.engine import LABEL_OWNER, engine_env, podman_argv, podman_sync
from prefect_harbor.sandbox.engine_service import reap_orphaned_folders
from prefect_harbor.sandbox.owners import owner_alive, owner_token

_watchdog_lock = threading.Lock()
_watchdog: subprocess.Popen | None = None


def ensure_watchdog() -> None:
    """Start this process's watchdog once (idempotent, thread-safe, cheap after the first call)."""
    global _watchdog
    with _watchdog_lock:
        if _watchdog is not None and _watchdog.poll() is None:
            return
        owner = owner_token()
        label = f"label={LABEL_OWNER}={owner}"
        script = (
            'trap "" INT TERM HUP QUIT; cat >/dev/null; '
            f"pods=$({shlex.join(podman_argv('pod', 'ps', '-q', '--filter', label))}); "
            f'[ -n "$pods" ] && {shlex.join(podman_argv("pod", "rm", "-f", "-t", "0"))} $pods >/dev/null 2>&1; '
            f"ids=$({shlex.join(podman_argv('ps', '-aq', '--filter', label))}); "
            f'[ -n "$ids" ] && {shlex.join(podman_argv("rm", "-f", "-t", "0"))} $ids >/dev/null 2>&1; '
            f"{firewall.withdraw_owner_script(owner)} >/dev/null 2>&1; exit 0"
        )
        _watchdog = subprocess.Popen(
            ["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=engine_env(), start_new_session=True, close_fds=True,
        )  # fmt: skip
        # The pipe's write end stays open in this process alone (never inherited by children).
        assert _watchdog.stdin is not None  # stdin=PIPE
        os.set_inheritable(_watchdog.stdin.fileno(), False)


def reap_orphans() -> list[str]:
    """Remove every pod and container of this project whose owner process is gone; their names.

    Pods first: removing one removes its services' containers and its infra container too.
    """
    pods = _orphans("pod", "ps", name_field="Name")
    if pods:
        podman_sync("pod", "rm", "-f", "-t", "0", *(pid for pid, _ in pods), timeout=120)
    containers = _orphans("ps", "-a", name_field="Names")
    if containers:
        podman_sync("rm", "-f", "-t", "0", *(cid for cid, _ in containers), timeout=120)
    firewall.withdraw_dead_owners(owner_alive)
    reap_orphaned_folders(owner_alive)
    return [name for _, name in pods + containers]


def _orphans(*listing: str, name_field: str) -> list[tuple[str, str]]:
    """(id, name) of what ``podman LISTING`` shows with an owner label whose owner is gone."""
    template = f'{{{{.ID}}}} {{{{.{name_field}}}}} {{{{index .Labels "{LABEL_OWNER}"}}}}'
    listed = podman_sync(*listing, "--filter", f"label={LABEL_OWNER}", "--format", template)
    if listed.returncode != 0:
        return []
    rows = [line.split() for line in listed.text.splitlines() if len(line.split()) == 3]
    return [(oid, name) for oid, name, owner in rows if not owner_alive(owner)]
