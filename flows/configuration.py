"""Loading a flow's configuration: saved blocks by name, or inline values re-checked."""

from __future__ import annotations

from pydantic import ValidationError

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.endpoint import ModelEndpoint
from prefect_harbor.blocks.storage import ResultsStorage
from prefect_harbor.config import ConfigurationError, describe


async def load_block[B: (HarborBackend, ResultsStorage, ModelEndpoint)](block_type: type[B], name: str, field: str) -> B:
    """Load a saved block by name; a missing or no-longer-valid one is a configuration error."""
    try:
        return await block_type.aload(name)
    except ValueError as error:
        raise ConfigurationError(f"{field}: {error}") from error
    except RuntimeError as error:  # Prefect wraps a failed validation of the saved values
        cause = error.__cause__
        reason = describe(cause) if isinstance(cause, ValidationError) else str(cause or error)
        raise ConfigurationError(f"{field} {name!r} is no longer valid: {reason}") from error


async def resolve_backend(backend: HarborBackend | None, backend_block: str | None) -> HarborBackend:
    """The configuration by block name or inline, checked again against the disk as it is now."""
    if (backend is None) == (backend_block is None):
        raise ConfigurationError("give exactly one of `backend` (inline) or `backend_block` (a saved Harbor Backend block's name).")
    if backend_block is not None:
        return await load_block(HarborBackend, backend_block, "backend_block")
    assert backend is not None
    return backend.revalidated()
