"""Prewarm, Osmosis's way: set every selected task up once before its rows run.

One install-only Harbor trial per task (``TrialConfig.install_only``: environment started,
agent set up, no agent run, verifier off) with no credentials. A task whose environment
or agent setup fails is known before its rows start, so its rows fail at once with that
reason instead of each failing slowly in its own trial.

A native agent's setup that passed on this host is remembered by everything it depends on (the
task image, task.toml, the agent and its options, the mounts, the package versions): the next
prewarm of the same setup skips the install-only trial, so a second sweep's prewarm costs
lookups, not containers. Its rows still set up their own agent in their own trials.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

from harbor.trial.trial import Trial
from pydantic import BaseModel, Field

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.endpoint import ModelEndpoint
from prefect_harbor.pyenvs import cache_root
from prefect_harbor.rows import DatasetRow
from prefect_harbor.sandbox import ImageBuildError, prepare_task_image
from prefect_harbor.sources import ResolvedTask, RowRejected, task_dir_under
from prefect_harbor.storage import package_versions
from prefect_harbor.trials import RunContext, build_trial_config, environment_kwargs, prepare_task, stage_workflow_input, trial_name_for

#: Install-only trials never call a model: their agents are wired to this unroutable address.
NO_ENDPOINT = ModelEndpoint(base_url="http://127.0.0.1:9/prewarm-makes-no-model-calls")


class PrewarmResult(BaseModel):
    """How one task's setup went."""

    task: str
    ok: bool
    seconds: float = Field(description="Wall time of the image build and the install-only trial.")
    error: str | None = None
    image: str | None = Field(default=None, description="The task's image, in the local container sandbox.")
    build_log: str | None = Field(default=None, description="Host path of the image's build log, when this prewarm built it.")


def prewarm_targets(backend: HarborBackend, task_ids: list[str] | None) -> list[ResolvedTask | str]:
    """The tasks to set up: the template, or the dataset's task ids (unknown ids are returned as strings)."""
    if backend.task_mode == "template":
        return [ResolvedTask(name=backend.tasks_dir.name, path=backend.tasks_dir)]
    targets: list[ResolvedTask | str] = []
    for task_id in task_ids or []:
        path = task_dir_under(backend.tasks_dir, task_id)
        known = path is not None and (path / "task.toml").is_file()
        targets.append(ResolvedTask(name=task_id, path=path) if known else task_id)
    return targets


async def prewarm_task(task: ResolvedTask, backend: HarborBackend, run: RunContext, logger: logging.Logger | logging.LoggerAdapter) -> PrewarmResult:
    """Run one install-only trial of ``task``; never raises for a failure of the task itself."""
    started = time.perf_counter()
    template = backend.task_mode == "template"
    row = DatasetRow(id=f"prewarm-{task.name}", prompt=[{"role": "user", "content": "prewarm"}] if template else None)
    trial_name = trial_name_for(row.id)
    # No credentials: the endpoint (and its key) is replaced, and the agent never runs anyway.
    uncredentialed = backend.model_copy(update={"model_endpoint": NO_ENDPOINT if backend.model_endpoint else None})
    copy = run.tasks_copy_dir / trial_name
    image, build_log = None, None
    try:
        task_path = await asyncio.to_thread(prepare_task, row, uncredentialed, task, copy, logger, run.bundle)
        if backend.environment.is_local_sandbox:
            image, build_log = await prepare_task_image(task_path, environment_kwargs(backend, run), logger)
        passed = passed_setup(task_path, image, backend, run)
        if passed is not None and passed.is_file():
            logger.info(f"{task.name}: set up before on this host with the same image, task.toml and agent; install-only trial skipped")
            message = None
        else:
            message = await _install_only_trial(row, uncredentialed, task_path, run, trial_name)
            if message is None and passed is not None:
                passed.parent.mkdir(parents=True, exist_ok=True)
                passed.touch()
    except RowRejected as rejected:
        message = str(rejected)
    except ImageBuildError as failed:
        message, build_log = f"image build failed: {failed}", failed.log_path
    except Exception as error:  # Trial.create raises what the task's environment definition raised
        message = f"{type(error).__name__}: {error}"
    finally:
        for leftover in (copy, run.trials_dir / trial_name):
            await asyncio.to_thread(shutil.rmtree, leftover, True)
        run.input_path(trial_name).unlink(missing_ok=True)
    return PrewarmResult(
        task=task.name, ok=message is None, seconds=round(time.perf_counter() - started, 3), error=message,
        image=image, build_log=str(build_log) if build_log else None,
    )  # fmt: skip


async def _install_only_trial(row: DatasetRow, backend: HarborBackend, task_path: Path, run: RunContext, trial_name: str) -> str | None:
    """The environment started and the agent set up, nothing run: why it failed, or None."""
    if backend.is_workflow:
        await asyncio.to_thread(stage_workflow_input, row, backend, run.input_path(trial_name))
    config = build_trial_config(backend, row, task_path, run, trial_name)
    config.install_only = True
    config.verifier.disable = True
    result = await (await Trial.create(config)).run()
    error = result.exception_info
    return f"{error.exception_type}: {error.exception_message}" if error else None


def passed_setup(task_path: Path, image: str | None, backend: HarborBackend, run: RunContext) -> Path | None:
    """The marker of this exact setup having passed here; None when it cannot be remembered
    (no local image to key on, or a workflow bundle, whose setup depends on more than this)."""
    if image is None or not backend.is_native or backend.has_bundle:
        return None
    setup = {
        "image": image,
        "task.toml": (task_path / "task.toml").read_text(),
        "agent": backend.agent,
        "agent_options": backend.native_agent_kwargs,
        "mounts": run.mounts,
        "versions": package_versions(),
    }
    digest = hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()
    return cache_root() / "prewarmed" / digest


def unknown_task(task_id: str, tasks_dir: Path) -> PrewarmResult:
    return PrewarmResult(task=task_id, ok=False, seconds=0.0, error=f"unknown harbor task id {task_id!r} (no task directory under {tasks_dir})")
