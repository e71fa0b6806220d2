"""A row's ``hosts_tried``: where its trial tried to go.

Both come from the trial's sandbox report (``network`` section): a trial without a network of
its own (``no-network``, ``allowlist``) goes out only through its proxy, which writes each
destination asked for, by name, allowed or refused (``sandbox/egress.py``); a trial on the
public network is watched through the host's connection table, which gives the addresses it
reached (``sandbox/connections.py``). Null where neither could watch (another Harbor
environment, a host without connection tracking).
"""

from __future__ import annotations

from pathlib import Path

from prefect_harbor.sandbox.egress import MAX_RECORDED
from prefect_harbor.sandbox.trial_report import read_sections

#: The most destinations a row lists (the archive's sandbox/ report has them all).
_KEPT = 50


def hosts_tried(trial_dir: Path) -> list[str] | None:
    """``host:port`` (``/udp`` for UDP) for each destination, ``(refused: why)`` after those refused,
    in the order first seen; empty when there was none; None when the trial was not observed."""
    entries = read_sections(trial_dir, "network")
    if entries is None:
        return None
    seen: list[str] = []
    for entry in sorted(entries, key=lambda entry: float(entry.get("first") or 0)):
        if entry.get("more"):
            seen.append(f"and {entry['more']} requests past the proxy's list of {MAX_RECORDED} destinations")
            continue
        line = f"{entry.get('host')}:{entry.get('port')}" + ("/udp" if entry.get("protocol") == "udp" else "")
        if not entry.get("allowed"):
            line += f" (refused: {str(entry.get('why') or 'not allowed')[:200]})"
        if line not in seen:
            seen.append(line)
    return seen[:_KEPT] + ([f"and {len(seen) - _KEPT} more (the archive's sandbox/ report lists them)"] if len(seen) > _KEPT else [])
