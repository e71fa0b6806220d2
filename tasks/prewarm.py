"""The per-task prewarm step: one install-only trial, retry-free."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_harbor.rows.sources import ResolvedTask
from prefect_harbor.spec import BackendSpec
from prefect_harbor.trial.prewarm import PrewarmResult, prewarm_task, set_up_before
from prefect_harbor.trial.row_trial import RunContext


@task(name="prewarm-trial", task_run_name="prewarm {task.name}", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def prewarm_trial(task: ResolvedTask, backend: BackendSpec, run: RunContext) -> PrewarmResult:
    """Set the task's environment and agent up once, with no credentials and no verifier."""
    logger = get_run_logger()
    result = await prewarm_task(task, backend, run, logger)
    if result.ok and result.reused:
        logger.info(f"Prewarmed {task.name} in {result.seconds:.2f} s: set up before on this host with the same image, task.toml and agent")
    elif result.ok:
        logger.info(f"Prewarmed {task.name} in {result.seconds:.2f} s")
    else:
        logger.error(f"Prewarm of {task.name} failed: {result.error}")
    return result


@task(name="find-prewarmed", task_run_name="find tasks set up before", retries=0, cache_policy=NO_CACHE, persist_result=False)
async def find_prewarmed(tasks: list[ResolvedTask], backend: BackendSpec, run: RunContext) -> dict[str, PrewarmResult]:
    """The tasks with nothing left to set up on this host: one task run for all of them."""
    logger = get_run_logger()
    found = await set_up_before(tasks, backend, run, logger)
    if found:
        logger.info(f"{len(found)} of {len(tasks)} tasks were set up before on this host with the same image, task.toml and agent, and their images are present")
    return found
