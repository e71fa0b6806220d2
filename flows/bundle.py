"""The ``build-bundle`` flow: the sweep's first step, also runnable on its own (e.g. from CI or the UI)."""

from __future__ import annotations

from prefect import flow, get_run_logger

from prefect_harbor.agents.bundles import inspect_bundle
from prefect_harbor.agents.harness import BundleRuntime
from prefect_harbor.agents.pyenvs import cache_root
from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.flows.configuration import resolve_backend
from prefect_harbor.tasks.bundle import build_workflow_bundle, prepare_bundle_environment


@flow(name="build-bundle", retries=0, validate_parameters=True)
async def build_bundle_flow(backend: HarborBackend | None = None, backend_block: str | None = None) -> BundleRuntime | None:
    """Build the backend's workflow bundle and prepare the environment its trials mount.

    Args:
        backend: The backend configuration, inline.
        backend_block: The name of a saved Harbor Backend block, instead of ``backend``.

    Returns None when the backend needs no bundle (a native agent without a grader).
    A second run with an unchanged project reuses the cached wheel and environment.
    """
    config = await resolve_backend(backend, backend_block)
    if not config.has_bundle:
        get_run_logger().info(f"Agent {config.agent} needs no bundle (no workflow agent, no grader)")
        return None
    cache = cache_root()
    spec = config.spec().bundle_spec()
    bundle = inspect_bundle(config.bundle) if config.bundle is not None else build_workflow_bundle(spec, cache)
    return prepare_bundle_environment(bundle, spec, cache)
