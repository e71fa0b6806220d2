"""``prefect-harbor check``: what a sweep would refuse, found per task before any trial.

Every check is the sweep's own code, not a copy of it: rows resolve through
:class:`~prefect_harbor.rows.sources.TaskResolver` (the task-source policy, ids that leave
``tasks_dir``, fetches), each task passes :func:`~prefect_harbor.trial.row_trial.validate_task`
(links, ``task.toml``, the reward source), and in the local sandbox
:func:`~prefect_harbor.sandbox.prepare_task_image` runs up to, not including, the build
(compose, no Dockerfile, a FROM it cannot read, a base image not in local storage), which
also says how the task's image will be had: its prebuilt ``docker_image``, pulled, or built.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prefect_harbor.rows.dataset import DatasetRow, RowProblem
from prefect_harbor.rows.sources import RowRejected, TaskResolver
from prefect_harbor.sandbox import BaseImageNotFoundError, ImageBuildError, prepare_task_image
from prefect_harbor.sandbox.images import BaseNotMadeError, ImageSource
from prefect_harbor.spec import BackendSpec
from prefect_harbor.task_folders import tasks_in
from prefect_harbor.trial.row_trial import task_environment_kwargs, validate_task

logger = logging.getLogger(__name__)


@dataclass
class TaskReport:
    """One task as the sweep would see it: ``problem`` fails its rows; ``note`` does not."""

    task: str
    rows: int | None
    reward_source: str | None = None
    problem: str | None = None
    note: str | None = None
    #: How the sweep will have the task's image: its local docker_image, a pull of it, or a build of its Dockerfile (and why).
    image: str | None = None


def task_rows(backend: BackendSpec, rows: Iterable[DatasetRow | RowProblem] | None) -> dict[str, list[DatasetRow | RowProblem]]:
    """Rows grouped by the task they name; without a dataset, one stand-in row per task of ``tasks_dir``."""
    if rows is None:
        if backend.sources.mode == "template":
            rows = [DatasetRow(id=backend.sources.tasks_dir.name)]
        else:
            rows = [DatasetRow(id=name, metadata={"harbor_task_id": name}) for name in tasks_in(backend.sources.tasks_dir)]
    groups: dict[str, list[DatasetRow | RowProblem]] = {}
    for row in rows:
        groups.setdefault(_named_task(row, backend), []).append(row)
    return dict(sorted(groups.items()))


def _named_task(row: DatasetRow | RowProblem, backend: BackendSpec) -> str:
    if isinstance(row, RowProblem):
        return "(unreadable rows)"
    if ref := row.metadata.get("harbor_task"):
        return str(ref)
    if backend.sources.mode == "template":
        return backend.sources.tasks_dir.name
    return row.task_id or "(no harbor_task_id)"


async def check_tasks(backend: BackendSpec, groups: dict[str, list[DatasetRow | RowProblem]], counted: bool) -> list[TaskReport]:
    """One report per task; remote tasks are fetched (as the sweep would) into a folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="prefect-harbor-check-") as cache:
        resolver = TaskResolver(backend.sources, Path(cache), logger)
        return [await _check(backend, resolver, name, rows, counted) for name, rows in groups.items()]


async def _check(backend: BackendSpec, resolver: TaskResolver, name: str, rows: list[DatasetRow | RowProblem], counted: bool) -> TaskReport:
    report = TaskReport(task=name, rows=len(rows) if counted else None)
    row = rows[0]
    if isinstance(row, RowProblem):
        report.problem = f"row {row.id}: {row.reason}"
        return report
    pull = backend.environment.kwargs.get("pull", True)
    try:
        task = await resolver.resolve(row)
        report.reward_source = validate_task(task, backend)
        if not backend.environment.is_local_sandbox:
            report.note = f"environment {backend.environment.label}: its image is not checked here"
            return report
        prepared = await prepare_task_image(task.path, task_environment_kwargs(backend), logger, build=False, force_build=backend.environment.force_build)
        report.image = image_plan(prepared.source, pull)
    except BaseNotMadeError as error:
        report.note = str(error)
    except BaseImageNotFoundError as error:
        if pull:
            report.note = f"check pulls nothing, the sweep will try to: {error}"
        else:
            report.problem = str(error)
    except (RowRejected, ImageBuildError, ValueError, OSError) as error:
        report.problem = str(error)
    return report


def image_plan(source: ImageSource, pull: bool) -> str:
    """What a sweep will do for the task's image, from how ``check`` (which pulls nothing) could have it."""
    dockerfile = "builds environment/Dockerfile"
    if not source.built:
        return f"uses docker_image {source.docker_image} (in local storage)"
    if source.docker_image and source.reason != "force_build":
        if pull:
            return f"pulls docker_image {source.docker_image}, or {dockerfile.replace('builds', 'builds its')} if it cannot be pulled"
        return f"{dockerfile} (docker_image {source.docker_image} is not in local storage and pull is off)"
    return f"{dockerfile} (force_build)" if source.docker_image else dockerfile
