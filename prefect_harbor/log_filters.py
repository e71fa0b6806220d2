"""A filter on every log handler for the length of a block: how a flow's guards (secrets redacted,
control characters shown) reach every record it logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def on_every_handler(guard: logging.Filter) -> Iterator[None]:
    """``guard`` on every handler configured now, removed after the block.

    A handler filter (not a logger filter) sees records from every logger that reaches it:
    Harbor's, the trial's and Prefect's own, which a filter on a logger misses once they
    propagate. Prefect configures its handlers (API, console) before a flow starts, so they
    are all here. Guards added in turn run in turn, on each handler.
    """
    handlers = _all_handlers()
    for handler in handlers:
        handler.addFilter(guard)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(guard)


def _all_handlers() -> list[logging.Handler]:
    """Each handler once, and logging's last resort: what prints a warning where no handler is
    configured (the command line's ``check``)."""
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values() if isinstance(item, logging.Logger))]
    last_resort = [logging.lastResort] if logging.lastResort is not None else []
    return list(dict.fromkeys([*(handler for logger in loggers for handler in logger.handlers), *last_resort]))
