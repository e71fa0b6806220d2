"""Loading a flow's configuration: saved blocks by name, or inline values re-checked."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.endpoint import ModelEndpoint
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.config import VERBOSE_VARIABLE, ConfigurationError, describe
from prefect_harbor.sandbox.limits import ProcessBudgetError, trial_pids_limit


async def load_block[B: (HarborBackend, ResultsStorage, ModelEndpoint)](block_type: type[B], name: str, field: str) -> B:
    """Load a saved block by name; a missing or no-longer-valid one is a configuration error."""
    try:
        return await block_type.aload(name)
    except ValueError as error:
        raise ConfigurationError(f"{field}: {error}") from error
    except RuntimeError as error:  # Prefect wraps a failed validation of the saved values
        cause = error.__cause__
        reason = describe(cause) if isinstance(cause, ValidationError) else str(cause or error)
        # Saved from the UI (which checks little) or valid once and not now (its tasks_dir changed):
        # either way the saved values fail today's checks, and the fix is to edit the block.
        raise ConfigurationError(f"{field} {name!r} is not a valid {block_type.get_block_type_name()} block: {reason}; edit it (UI: Blocks) and save it again.") from error


async def resolve_backend(backend: HarborBackend | None, backend_block: str | None) -> HarborBackend:
    """The configuration by block name or inline, checked again against the disk as it is now."""
    if (backend is None) == (backend_block is None):
        raise ConfigurationError("give exactly one of `backend` (inline) or `backend_block` (a saved Harbor Backend block's name).")
    if backend_block is not None:
        return await load_block(HarborBackend, backend_block, "backend_block")
    assert backend is not None
    return backend.revalidated()


def check_process_budget(config: HarborBackend) -> None:
    """The local sandbox's trials at once must fit the host's process budget with their per-trial limit."""
    if config.environment.is_local_sandbox:
        try:
            trial_pids_limit(config.environment.kwargs.get("pids_limit"), config.n_concurrent)
        except ProcessBudgetError as error:
            raise ConfigurationError(str(error)) from None


async def resolve_storage(storage: ResultsStorage | None, storage_block: str | None) -> ResultsStorage | None:
    """Where results go: a Results Storage block picked or given (``storage``), or named (``storage_block``); None: ``results``."""
    if storage is not None and storage_block is not None:
        raise ConfigurationError("storage: give one of `storage` (a picked Results Storage block) or `storage_block` (its name), not both.")
    return await load_block(ResultsStorage, storage_block, "storage_block") if storage_block else storage


class ConfigurationErrorInOneLine(logging.Filter):
    """A configuration error is the user's to fix, not a bug: its message names the field and
    the fix, so Prefect's "Encountered exception" record keeps that line and drops the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ConfigurationError):
            record.exc_info, record.exc_text = None, None
        return True


@contextmanager
def harbor_logs_in_trial_logs_only() -> Iterator[None]:
    """Keep Harbor's per-trial lines (DEBUG steps, per-row warnings) off the console and the
    Prefect API log, whatever started the flow (CLI, serve, worker); trial.log keeps them."""
    harbor = logging.getLogger("harbor.utils.logger")
    before = harbor.propagate
    harbor.propagate = bool(os.environ.get(VERBOSE_VARIABLE))
    try:
        yield
    finally:
        harbor.propagate = before


class ReturnedFailureOnce(logging.Filter):
    """A row's task run returns its Failed state on purpose; Prefect then logs "Task run failed with
    state: Failed(... result=[RowResult(...)])" at ERROR with an empty traceback ("NoneType: None"),
    beside its own "Finished in state Failed(<category: message>)". Keep the second, which says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Task run failed with state: ")


def install_log_filters() -> None:
    """Once per process (idempotent): Prefect's flow and task run loggers get the one-line rules."""
    for name, rules in (("prefect.flow_runs", (ConfigurationErrorInOneLine,)), ("prefect.task_runs", (ConfigurationErrorInOneLine, ReturnedFailureOnce))):
        logger = logging.getLogger(name)
        for rule in rules:
            if not any(isinstance(f, rule) for f in logger.filters):
                logger.addFilter(rule())
