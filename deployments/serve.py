"""Deployments of the sweep, served from this process (``prefect-harbor serve``).

Two deployments of ``evaluation-sweep``:

* ``evaluation-sweep/sweep`` -- on demand: ``prefect deployment run`` or the UI's run form,
  with the typed parameters (dataset, backend block, results or storage block, concurrency);
* ``evaluation-sweep/nightly`` -- the same sweep on a schedule (cron, e.g. ``0 2 * * *``),
  when a dataset and a backend block are given for it.

plus the sweep's first steps as deployments of their own, for running them ahead of a sweep
(e.g. after a release of the agent project): ``build-bundle/build-bundle`` and ``prewarm/prewarm``.

Each sweep deployment carries a deployment concurrency limit: a flood of ``prefect deployment run`` calls
queues (ENQUEUE) instead of starting more sweeps than the machine can hold -- the
pipeline's counterpart of the Osmosis backend's HTTP 429.

Their entrypoints are module paths (``prefect_harbor.flows.sweep.evaluation_sweep``), the same
wherever ``serve`` starts: a file path would be relative to that folder (``../../…/flows/sweep.py``),
and the serve process, loading the flow to run its hooks after a cancel, would "download" the
deployment's folder (a copy of the working directory) and log it in the run.
"""

from __future__ import annotations

from datetime import timedelta

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.types.entrypoint import EntrypointType

from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.flows.bundle import build_bundle_flow
from prefect_harbor.flows.certify import certify_tasks
from prefect_harbor.flows.prewarm import prewarm_flow

TAGS = ["prefect-harbor", "evaluation"]


def sweep_deployments(
    *,
    max_concurrent_sweeps: int = 1,
    nightly_dataset: str | None = None,
    nightly_backend_block: str | None = None,
    nightly_results: str = "results",
    cron: str = "0 2 * * *",
    interval_seconds: float | None = None,
) -> list[RunnerDeployment]:
    """The on-demand sweep, bundle, prewarm and certify deployments, plus the scheduled sweep when it has a dataset and a backend."""
    limit = ConcurrencyLimitConfig(limit=max_concurrent_sweeps, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
    by_module = EntrypointType.MODULE_PATH
    deployments = [
        evaluation_sweep.to_deployment(
            name="sweep",
            description="Run a dataset as Harbor trials; give a backend block (or inline backend) and a dataset URL.",
            concurrency_limit=limit,
            tags=TAGS,
            entrypoint_type=by_module,
        ),
        build_bundle_flow.to_deployment(
            name="build-bundle", description="Build (or reuse) a backend's workflow bundle and its environment.", tags=TAGS, entrypoint_type=by_module
        ),
        prewarm_flow.to_deployment(
            name="prewarm", description="Set up each task of a backend once, install-only, and report per task.", tags=TAGS, entrypoint_type=by_module
        ),
        certify_tasks.to_deployment(
            name="certify", description="Certify tasks before sweeps use them: the oracle always rewarded, doing nothing never.", tags=TAGS,
            entrypoint_type=by_module,
        ),
    ]
    if nightly_dataset and nightly_backend_block:
        schedule = {"interval": timedelta(seconds=interval_seconds)} if interval_seconds else {"cron": cron}
        deployments.append(
            evaluation_sweep.to_deployment(
                name="nightly",
                description=f"Scheduled sweep of {nightly_dataset} with backend block {nightly_backend_block!r}.",
                parameters={"dataset": nightly_dataset, "backend_block": nightly_backend_block, "results": nightly_results},
                concurrency_limit=limit,
                tags=[*TAGS, "scheduled"],
                entrypoint_type=by_module,
                **schedule,
            )
        )
    return deployments


def serve_sweeps(**options) -> None:
    """Register the deployments and run their flow runs from this process until stopped."""
    serve(*sweep_deployments(**options))
