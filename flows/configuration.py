"""Loading a flow's configuration: saved blocks by name, or inline values re-checked."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect.blocks.core import Block
from pydantic import ValidationError

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.endpoint import ModelEndpoint
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.config import VERBOSE_VARIABLE, ConfigurationError, describe
from prefect_harbor.sandbox.limits import ProcessBudgetError, trial_pids_limit
from prefect_harbor.secrets import Redactor, redacting_logs
from prefect_harbor.text import visible_logs

#: What the run form's block picker sends for a picked block: ``{"$ref": {"block_document_id": "…"}}``.
Reference = dict[str, Any]


def is_reference(value: object) -> bool:
    return isinstance(value, dict) and "$ref" in value


async def load_block[B: (HarborBackend, ResultsStorage, ModelEndpoint)](block_type: type[B], name: str | Reference, field: str) -> B:
    """Load a saved block by name, or by the reference the run form's picker sends; a missing or
    no-longer-valid one is a configuration error naming ``field``, the block and the fix, whichever way it was given."""
    try:
        if is_reference(name):
            return await block_type.aload_from_ref(name["$ref"])
        return await block_type.aload(name)
    except ValueError as error:
        raise ConfigurationError(f"{field}: {error}") from error
    except RuntimeError as error:  # Prefect wraps a failed validation of the saved values
        cause = error.__cause__
        reason = describe(cause) if isinstance(cause, ValidationError) else str(cause or error)
        shown = await asyncio.to_thread(referenced_block_name, name) if is_reference(name) else name
        raise not_valid(field, shown, block_type, reason) from error


def not_valid(field: str, name: str | None, block_type: type[Block], reason: str) -> ConfigurationError:
    """A saved block whose values fail today's checks: saved from the UI (which checks little), or valid
    once and not now (its tasks_dir went away). Either way the fix is to edit the block."""
    block = f"{field} {name!r}" if name else field
    return ConfigurationError(f"{block} is not a valid {block_type.get_block_type_name()} block: {reason.rstrip('.')}; edit it (UI: Blocks) and save it again.")


def referenced_block_name(reference: Reference) -> str | None:
    """The saved name of the block a picker's reference points to (None: not found). Synchronous:
    the run's name is computed (``reporting.sweep_run_name``) before the flow starts."""
    from prefect.client.orchestration import get_client

    ref = reference.get("$ref") or {}
    if "block_document_id" not in ref:
        return ref.get("block_document_slug")
    try:
        with get_client(sync_client=True) as client:
            return client.read_block_document(UUID(str(ref["block_document_id"])), include_secrets=False).name
    except Exception:  # a name is only for a message or a run's name; what failed is said elsewhere
        return None


async def backend_block_name(backend: HarborBackend | Reference | None, backend_block: str | None) -> str | None:
    """The saved name of the Harbor Backend block a run was given: by name, picked in the form, or loaded in code."""
    if backend_block is not None:
        return backend_block
    if is_reference(backend):
        return await asyncio.to_thread(referenced_block_name, backend)
    return getattr(backend, "_block_document_name", None)


async def picked[B: (HarborBackend, ResultsStorage)](block_type: type[B], value: B | Reference | None, field: str) -> B | None:
    """A block parameter as the flow received it: a block (in code), a picker's reference (the run form), or nothing.

    The flow takes its parameters unvalidated (``validate_parameters=False``): Prefect's own
    validation loads a picked block first and, when its saved values are no longer valid,
    fails the run with "Failed to resolve block references in parameters" before the run is
    named or tagged. Loaded here, a bad block fails as it does by name."""
    if is_reference(value):
        return await load_block(block_type, value, field)
    if isinstance(value, dict):  # its fields, as JSON (``--param backend='{"tasks_dir": …}'``)
        try:
            return block_type.model_validate(value)
        except ValidationError as error:
            raise ConfigurationError(f"{field}: {describe(error)}") from error
    if value is not None and not isinstance(value, block_type):
        raise ConfigurationError(f"{field}: expected a {block_type.get_block_type_name()} block, got {type(value).__name__}.")
    return value


async def resolve_backend(backend: HarborBackend | None, backend_block: str | None) -> HarborBackend:
    """The configuration by block name or inline, checked again against the disk as it is now."""
    if (backend is None) == (backend_block is None):
        raise ConfigurationError("give exactly one of `backend` (inline) or `backend_block` (a saved Harbor Backend block's name).")
    if backend_block is not None:
        return await load_block(HarborBackend, backend_block, "backend_block")
    assert backend is not None
    try:
        return backend.revalidated()
    except ValidationError as error:  # valid when made or loaded, not now (its tasks_dir went away)
        if backend._block_document_name is None:  # made in code: there is no block to edit
            raise ConfigurationError(describe(error)) from error
        raise not_valid("backend", backend._block_document_name, HarborBackend, describe(error)) from error


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


@contextmanager
def sweep_logs(redactor: Redactor) -> Iterator[None]:
    """How a sweep's (or a shard's) log records leave: Harbor's per-trial lines kept to trial logs, then on every
    handler the run's secrets redacted and control characters shown, in that order (a secret is matched as written)."""
    with harbor_logs_in_trial_logs_only(), redacting_logs(redactor), visible_logs():
        yield


class ReturnedFailureOnce(logging.Filter):
    """A row's task run returns its Failed state on purpose; Prefect then logs "Task run failed with
    state: Failed(... result=[RowResult(...)])" at ERROR with an empty traceback ("NoneType: None"),
    beside its own "Finished in state Failed(<category: message>)". Keep the second, which says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Task run failed with state: ")


class CancelledIsNotAnError(logging.Filter):
    """Prefect logs every final state but Completed at ERROR. A Cancelled sweep or row was asked for
    (the UI's Cancel, ``prefect-harbor cancel``, Ctrl-C): its "Finished in state Cancelled(…)" is INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and _FINISHED_CANCELLED.match(str(record.msg)):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


#: Prefect's line for a run that ended Cancelled: ``Cancelled('…')``, or a named one ``0/5 rewarded('…', type=CANCELLED)``.
_FINISHED_CANCELLED = re.compile(r"Finished in state (Cancelled\(|.*type=CANCELLED\)$)", re.DOTALL)


def install_log_filters() -> None:
    """Once per process (idempotent): Prefect's flow and task run loggers get the one-line rules."""
    flow_rules, task_rules = (ConfigurationErrorInOneLine, CancelledIsNotAnError), (ConfigurationErrorInOneLine, ReturnedFailureOnce, CancelledIsNotAnError)
    for name, rules in (("prefect.flow_runs", flow_rules), ("prefect.task_runs", task_rules)):
        logger = logging.getLogger(name)
        for rule in rules:
            if not any(isinstance(f, rule) for f in logger.filters):
                logger.addFilter(rule())
