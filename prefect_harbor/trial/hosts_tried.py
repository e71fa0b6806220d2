"""A row's ``hosts_tried``: the destinations its trial asked its proxy for.

A trial without a network of its own (``no-network``, ``allowlist``) goes out only through its
proxy, which writes each destination asked for to the trial's sandbox report (``network``
section, ``sandbox/egress.py``). A trial on the public network is not observed: null.
"""

from __future__ import annotations

from pathlib import Path

from prefect_harbor.sandbox.trial_report import read_sections

#: The most destinations a row lists (the archive's sandbox/ report has them all).
_KEPT = 50


def hosts_tried(trial_dir: Path) -> list[str] | None:
    """``host:port`` for each destination asked for, ``(refused: why)`` after those refused, in
    the order first asked; empty when nothing was; None when the trial was not observed."""
    entries = read_sections(trial_dir, "network")
    if entries is None:
        return None
    seen: list[str] = []
    for entry in sorted(entries, key=lambda entry: float(entry.get("first") or 0)):
        line = f"{entry.get('host')}:{entry.get('port')}"
        if not entry.get("allowed"):
            line += f" (refused: {str(entry.get('why') or 'not allowed')[:200]})"
        if line not in seen:
            seen.append(line)
    return seen[:_KEPT] + ([f"and {len(seen) - _KEPT} more (the archive's sandbox/ report lists them)"] if len(seen) > _KEPT else [])
