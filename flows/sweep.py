"""The ``evaluation-sweep`` flow: a dataset fanned out into one Harbor trial per row."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.context import get_run_context
from pydantic import ValidationError

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.config import ConfigurationError, describe
from prefect_harbor.results import ResultsWriter, RowResult, SweepSummary
from prefect_harbor.rows import DatasetRow, RowProblem, iter_rows
from prefect_harbor.sources import TaskResolver
from prefect_harbor.tasks import inspect_dataset, run_trial
from prefect_harbor.trials import RunContext

SUMMARY_ARTIFACT_KEY = "evaluation-sweep-summary"


def new_run_id() -> str:
    """Sortable and unique: ``20261129T181500Z-1a2b3c4d`` (the flow run's id when there is one)."""
    try:
        suffix = str(get_run_context().flow_run.id)[:8]
    except Exception:  # called outside a flow run
        suffix = uuid.uuid4().hex[:8]
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{suffix}"


async def resolve_backend(backend: HarborBackend | None, backend_block: str | None) -> HarborBackend:
    """The configuration by block name or inline, checked again against the disk as it is now."""
    if (backend is None) == (backend_block is None):
        raise ConfigurationError("give exactly one of `backend` (inline) or `backend_block` (a saved Harbor Backend block's name).")
    if backend_block is not None:
        try:
            return await HarborBackend.aload(backend_block)
        except ValueError as error:
            raise ConfigurationError(f"backend_block: {error}") from error
        except RuntimeError as error:  # Prefect wraps a failed validation of the saved values
            cause = error.__cause__
            reason = describe(cause) if isinstance(cause, ValidationError) else str(cause or error)
            raise ConfigurationError(f"backend_block {backend_block!r} is no longer valid: {reason}") from error
    assert backend is not None
    return backend.revalidated()


@flow(name="evaluation-sweep", retries=0, validate_parameters=True)
async def evaluation_sweep(
    dataset: str,
    backend: HarborBackend | None = None,
    backend_block: str | None = None,
    results: str = "results",
    concurrency: int | None = None,
) -> SweepSummary:
    """Run every row of ``dataset`` as a Harbor trial and write the results table.

    Args:
        dataset: JSONL or Parquet rows, a path or an fsspec URL.
        backend: The backend configuration, inline (code users) or a saved block (UI).
        backend_block: The name of a saved Harbor Backend block, instead of ``backend``.
        results: The results root, a local path or an fsspec URL.
        concurrency: Overrides the backend's ``n_concurrent`` for this run.

    Rows run ``n_concurrent`` at a time; the next row is read from the dataset only
    when a slot frees up, so a large dataset never becomes thousands of pending task
    runs. Every row yields exactly one result row, whatever happens to it.
    """
    logger = get_run_logger()
    config = await resolve_backend(backend, backend_block)
    if concurrency is not None:
        config = config.model_copy(update={"n_concurrent": concurrency})
    info = await asyncio.to_thread(inspect_dataset, dataset)
    run_id = new_run_id()
    writer = await asyncio.to_thread(ResultsWriter, results, run_id)
    run = RunContext(run_id=run_id, trials_dir=Path(config.trials_dir).expanduser().resolve() / run_id)
    resolver = TaskResolver(config, cache_dir=run.trials_dir / "_fetched", logger=logger)
    logger.info(
        f"Sweep {run_id}: {info.rows} rows from {dataset} ({info.problems} unusable), "
        f"{config.task_mode} mode, agent {config.agent}, {config.n_concurrent} at a time"
    )

    results_so_far: list[RowResult] = []
    slots = asyncio.Semaphore(config.n_concurrent)

    async def one_row(index: int, row: DatasetRow | RowProblem) -> None:
        try:
            result = await run_trial(row, index, config, resolver, run)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug must cost one row, never the sweep
            logger.exception(f"Row {row.id} crashed the trial task")
            result = RowResult(
                row_index=index, row_id=row.id, agent=config.agent, status="failure",
                err_category="agent_error", err_message=f"internal error: {type(error).__name__}: {error}",
            )  # fmt: skip
        finally:
            slots.release()
        await asyncio.to_thread(writer.write_row, result)
        results_so_far.append(result)
        reward = "-" if result.reward is None else f"{result.reward:g}"
        logger.info(f"Row {result.row_id} ({result.task}): {result.status}, reward {reward}" + (f" — {result.err_message}" if result.err_message else ""))

    async with asyncio.TaskGroup() as group:
        for index, row in enumerate(iter_rows(dataset)):
            await slots.acquire()
            group.create_task(one_row(index, row))

    results_uri = await asyncio.to_thread(writer.finalize, results_so_far)
    summary = SweepSummary.of(run_id, results_uri, results_so_far)
    await acreate_table_artifact(
        key=SUMMARY_ARTIFACT_KEY,
        table=[
            {"task": task, "rows": score.rows, "mean_reward": score.mean_reward}
            for task, score in summary.per_task.items()
        ],
        description=(
            f"Sweep {run_id}: {summary.rows} rows, {summary.success} success, {summary.failure} failure, "
            f"{summary.cancelled} cancelled; mean reward {summary.mean_reward}. Results: {results_uri}"
        ),
    )
    logger.info(f"Results: {results_uri}")
    return summary
