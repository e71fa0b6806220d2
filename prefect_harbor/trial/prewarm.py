"""Prewarm, Osmosis's way: set every selected task up once before its rows run.

One install-only Harbor trial per task (``TrialConfig.install_only``: environment started,
agent set up, no agent run, verifier off) with no credentials. A task whose environment
or agent setup fails is known before its rows start, so its rows fail at once with that
reason instead of each failing slowly in its own trial.

A native agent's setup that passed on this host is remembered by everything it depends on (the
task image, task.toml, the agent and its options, the mounts, the package versions): the next
prewarm of the same setup skips the install-only trial. Such tasks are found first, all in one
pass with one engine call for their images (:func:`set_up_before`), so a second sweep's prewarm
costs a lookup, not a task run or a container per task. Its rows still set up their own agent
in their own trials.
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

from prefect_harbor.agents.pyenvs import cache_root
from prefect_harbor.rows.dataset import DatasetRow
from prefect_harbor.rows.sources import ResolvedTask, RowRejected, task_dir_under
from prefect_harbor.sandbox import ImageBuildError, prepare_task_image, present_images, task_image_names
from prefect_harbor.spec import BackendSpec, Endpoint, WorkflowAgent
from prefect_harbor.storage.manifest import package_versions
from prefect_harbor.trial.row_trial import RunContext, build_trial_config, environment_kwargs, prepare_task, stage_workflow_input, trial_name_for

#: Install-only trials never call a model: their agents are wired to this unroutable address.
NO_ENDPOINT = Endpoint(base_url="http://127.0.0.1:9/prewarm-makes-no-model-calls")


class PrewarmResult(BaseModel):
    """How one task's setup went."""

    task: str
    ok: bool
    seconds: float = Field(description="Wall time of the image build and the install-only trial.")
    error: str | None = None
    image: str | None = Field(default=None, description="The task's image, in the local container sandbox.")
    image_source: str | None = Field(
        default=None, description="How the image was had: the task's prebuilt docker_image, or built from its Dockerfile (and why, when it names an image)."
    )
    build_log: str | None = Field(default=None, description="Host path of the image's build log, when this prewarm built it.")
    reused: bool = Field(default=False, description="The install-only trial was skipped: this exact setup passed on this host before.")


def prewarm_targets(backend: BackendSpec, task_ids: list[str] | None) -> list[ResolvedTask | str]:
    """The tasks to set up: the template, or the dataset's task ids (unknown ids are returned as strings)."""
    sources = backend.sources
    if sources.mode == "template":
        return [ResolvedTask(name=sources.tasks_dir.name, path=sources.tasks_dir)]
    targets: list[ResolvedTask | str] = []
    for task_id in task_ids or []:
        path = task_dir_under(sources.tasks_dir, task_id)
        known = path is not None and (path / "task.toml").is_file()
        targets.append(ResolvedTask(name=task_id, path=path) if path is not None and known else task_id)
    return targets


async def prewarm_task(task: ResolvedTask, backend: BackendSpec, run: RunContext, logger: logging.Logger | logging.LoggerAdapter) -> PrewarmResult:
    """Run one install-only trial of ``task``; never raises for a failure of the task itself."""
    started = time.perf_counter()
    row = _prewarm_row(task, backend)
    trial_name = trial_name_for(row.id)
    uncredentialed = _uncredentialed(backend)
    copy = run.tasks_copy_dir / trial_name
    image, source, build_log, reused = None, None, None, False
    try:
        task_path = await asyncio.to_thread(prepare_task, row, uncredentialed, task, copy, logger, run.bundle)
        if backend.environment.is_local_sandbox:
            prepared = await prepare_task_image(task_path, environment_kwargs(backend, run), logger, force_build=backend.environment.force_build)
            image, source, build_log = prepared.image, str(prepared.source), prepared.build_log
        passed = passed_setup(task_path, image, backend, run)
        if passed is not None and passed.is_file():
            message, reused = None, True
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
        image=image, image_source=source, build_log=str(build_log) if build_log else None, reused=reused,
    )  # fmt: skip


async def set_up_before(
    tasks: list[ResolvedTask], backend: BackendSpec, run: RunContext, logger: logging.Logger | logging.LoggerAdapter
) -> dict[str, PrewarmResult]:
    """The tasks whose exact setup passed on this host before and whose images are all present,
    by name: found in one pass and one engine call, so a second sweep's prewarm needs no task
    run (nor container) per task. Anything unclear is left out: its own prewarm decides."""
    if not remembers_setups(backend):
        return {}
    uncredentialed, kwargs = _uncredentialed(backend), environment_kwargs(backend, run)
    found: dict[str, tuple[list[str], float]] = {}
    for task in tasks:
        started = time.perf_counter()
        row = _prewarm_row(task, backend)
        copy = run.tasks_copy_dir / f"{trial_name_for(row.id)}-lookup"
        try:
            task_path = await asyncio.to_thread(prepare_task, row, uncredentialed, task, copy, logger, run.bundle)
            images = await task_image_names(task_path, kwargs, logger, force_build=backend.environment.force_build)
            marker = passed_setup(task_path, images[0], backend, run)
            if marker is not None and marker.is_file():
                found[task.name] = (images, time.perf_counter() - started)
        except Exception as error:  # noqa: BLE001 - the task's own prewarm reports it
            logger.debug(f"{task.name}: not looked up ({type(error).__name__}: {error})")
        finally:
            await asyncio.to_thread(shutil.rmtree, copy, True)
    present = await present_images({image for images, _ in found.values() for image in images})
    return {
        name: PrewarmResult(task=name, ok=True, seconds=round(seconds, 3), image=images[0], reused=True)
        for name, (images, seconds) in found.items()
        if set(images) <= present
    }


def remembers_setups(backend: BackendSpec) -> bool:
    """Whether a setup that passed can be remembered: a native agent in the local container
    sandbox (a workflow bundle's setup depends on more than the marker's key)."""
    return backend.environment.is_local_sandbox and backend.native is not None and backend.bundle is None


def _uncredentialed(backend: BackendSpec) -> BackendSpec:
    """No credentials: the endpoint (and its key) is replaced; an install-only trial never runs the agent anyway."""
    return backend.model_copy(update={"model": backend.model.model_copy(update={"endpoint": NO_ENDPOINT if backend.model.endpoint else None})})


def _prewarm_row(task: ResolvedTask, backend: BackendSpec) -> DatasetRow:
    template = backend.sources.mode == "template"
    return DatasetRow(id=f"prewarm-{task.name}", prompt=[{"role": "user", "content": "prewarm"}] if template else None)


async def _install_only_trial(row: DatasetRow, backend: BackendSpec, task_path: Path, run: RunContext, trial_name: str) -> str | None:
    """The environment started and the agent set up, nothing run: why it failed, or None."""
    if isinstance(backend.agent, WorkflowAgent):
        await asyncio.to_thread(stage_workflow_input, row, backend, run.input_path(trial_name))
    config = build_trial_config(backend, row, task_path, run, trial_name)
    config.install_only = True
    config.verifier.disable = True
    result = await (await Trial.create(config)).run()
    error = result.exception_info
    return f"{error.exception_type}: {error.exception_message}" if error else None


def passed_setup(task_path: Path, image: str | None, backend: BackendSpec, run: RunContext) -> Path | None:
    """The marker of this exact setup having passed here; None when it cannot be remembered
    (no local image to key on, or a workflow bundle, whose setup depends on more than this)."""
    native = backend.native
    if image is None or native is None or not remembers_setups(backend):
        return None
    setup = {
        "image": image,
        "task.toml": (task_path / "task.toml").read_text(),
        "agent": native.name,
        "agent_options": native.options,
        "mounts": run.mounts,
        "versions": package_versions(),
    }
    digest = hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()
    return cache_root() / "prewarmed" / digest


def unknown_task(task_id: str, tasks_dir: Path) -> PrewarmResult:
    return PrewarmResult(task=task_id, ok=False, seconds=0.0, error=f"unknown harbor task id {task_id!r} (no task directory under {tasks_dir})")
