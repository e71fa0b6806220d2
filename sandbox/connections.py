"""Where a trial on the public network connected: the kernel's connection tracking, read from the host.

A ``public`` trial goes out through the bridge's NAT, not through a proxy, so no name is seen;
the host's connection table (``/proc/net/nf_conntrack``) holds each connection the trial's
address opened that the guard let through (one the guard dropped is never confirmed, so never
listed), for as long as the kernel tracks it: two minutes after a TCP connection closes, half
a minute after a UDP exchange. One thread of this process reads the table every
:data:`POLL_SEC` for every watched trial, and once more when a trial stops watching, so a
connection is missed only if it ended and was forgotten between two reads.

Where the table cannot be read (no conntrack module), nothing is watched: the row's
``hosts_tried`` stays null, "not observed".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

TABLE = Path("/proc/net/nf_conntrack")
POLL_SEC = 2.0
#: (protocol, destination address, destination port) of one connection.
Destination = tuple[str, str, int]
Record = Callable[[Destination], None]

_lock = threading.Lock()
_watched: dict[str, tuple[Record, set[Destination]]] = {}
_poller: threading.Thread | None = None
_wake = threading.Event()


def observable() -> bool:
    """Whether this host's connection table can be read."""
    try:
        with TABLE.open("rb") as handle:
            handle.read(1)
        return True
    except OSError:
        return False


def parse(line: str) -> tuple[str, Destination] | None:
    """A table line's source address and destination, in the direction the connection was opened."""
    fields = line.split()
    if len(fields) < 4:
        return None
    values: dict[str, str] = {}
    for item in fields:
        key, _, value = item.partition("=")
        if value and key not in values:  # the first of each is the original direction's
            values[key] = value
    if not {"src", "dst", "dport"} <= values.keys() or not values["dport"].isdigit():
        return None
    return values["src"], (fields[2], values["dst"], int(values["dport"]))


def watch(addresses: list[str], record: Record) -> Callable[[], None]:
    """Call ``record`` once for each destination the trial at ``addresses`` connects to; the function
    returned stops watching, after a last read of the table.

    Call it before anything of the trial runs: what the table holds for ``addresses`` then is a
    former holder's of the address (a trial before, whose entries outlive it), never reported."""
    before = _destinations(set(addresses))
    with _lock:
        for address in addresses:
            _watched[address] = (record, before.get(address, set()))
        _start_poller()

    def stop() -> None:
        _read({address for address in addresses})
        with _lock:
            for address in addresses:
                _watched.pop(address, None)

    return stop


def _start_poller() -> None:
    global _poller
    if _poller is None or not _poller.is_alive():
        _poller = threading.Thread(target=_poll, name="connection-watch", daemon=True)
        _poller.start()


def _poll() -> None:
    while True:
        with _lock:
            if not _watched:
                global _poller
                _poller = None
                return
        _read(None)
        _wake.wait(POLL_SEC)


def _destinations(addresses: set[str]) -> dict[str, set[Destination]]:
    """What the table holds now for each of ``addresses``."""
    found: dict[str, set[Destination]] = {}
    for line in _lines():
        parsed = parse(line)
        if parsed is not None and parsed[0] in addresses:
            found.setdefault(parsed[0], set()).add(parsed[1])
    return found


def _lines() -> list[str]:
    try:
        return TABLE.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _read(only: set[str] | None) -> None:
    """Read the table once and hand each new destination of a watched address to its record."""
    with _lock:
        addresses = set(_watched) if only is None else only & set(_watched)
    held = _destinations(addresses)  # parsed outside the lock: the table can be long
    found: list[tuple[Record, Destination]] = []
    with _lock:
        for address, destinations in held.items():
            if address not in _watched:
                continue  # stopped meanwhile
            record, seen = _watched[address]
            found += [(record, destination) for destination in sorted(destinations - seen)]
            seen |= destinations
    for record, destination in found:
        record(destination)
