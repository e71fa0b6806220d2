"""Host-wide locks on files, waited for without blocking an event loop."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
from collections.abc import AsyncIterator
from pathlib import Path


@contextlib.asynccontextmanager
async def polled_flock(path: Path, *, shared: bool = False) -> AsyncIterator[None]:
    """An flock on ``path`` (exclusive, or ``shared``), polled so that waiting never blocks the
    event loop and stays cancellable.

    flock locks belong to an open file, so they serialize threads, event loops and processes alike.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
