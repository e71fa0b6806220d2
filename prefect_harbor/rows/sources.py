"""Which task a row runs: tasks_dir, its dataset sub-directories, or ``metadata.harbor_task``.

``metadata.harbor_task`` (wins over everything) names a local path, a Harbor registry
package ``org/name[@ref]``, or a path inside a git repository (``metadata.git_url``
pinned by ``metadata.git_commit_id``), parsed exactly as the Osmosis backend does.
Rows are data, not code, so a dynamic source is honoured only as far as the backend's
task source policy (:class:`~prefect_harbor.spec.Sources`) allows; remote sources are fetched with
Harbor's own ``TaskClient``, once per reference per run, shared by concurrent rows.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harbor.models.task.id import GitTaskId, LocalTaskId, PackageTaskId
from harbor.tasks.client import TaskClient

from prefect_harbor.rows.dataset import DatasetRow
from prefect_harbor.rows.terminal_bench import as_harbor_task, is_terminal_bench_task
from prefect_harbor.task_folders import is_task

if TYPE_CHECKING:
    from prefect_harbor.spec import Sources
    from prefect_harbor.storage.results import ErrorCategory

type TaskRef = GitTaskId | LocalTaskId | PackageTaskId


class RowRejected(Exception):
    """A row that cannot become a trial; it is recorded as a failure with this reason."""

    def __init__(self, message: str, category: ErrorCategory = "validation_error", phase: str = "setup"):
        super().__init__(message)
        self.category = category
        #: The phase the failure is recorded in: ``setup``, or ``certification`` (the task is not certified).
        self.phase = phase


@dataclass(frozen=True)
class ResolvedTask:
    """A task directory on local disk, ready to be copied for one row."""

    name: str
    path: Path
    dynamic: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)


def parse_task_ref(ref: str, metadata: dict) -> tuple[TaskRef, tuple[str, ...]]:
    """Parse ``metadata.harbor_task`` the Osmosis way; return the id and its warnings."""
    if git_url := metadata.get("git_url"):
        warnings = () if metadata.get("git_commit_id") else (
            f"git task {ref!r} is unpinned; set metadata['git_commit_id'] to an immutable commit sha",
        )  # fmt: skip
        return GitTaskId(git_url=git_url, git_commit_id=metadata.get("git_commit_id"), path=Path(ref)), warnings
    if ref.startswith((".", "/", "~")):
        return LocalTaskId(path=Path(ref).expanduser()), ()
    name, _, version = ref.partition("@")
    org, slash, task = name.partition("/")
    if not slash or not org or not task:
        raise RowRejected(
            f"harbor_task {ref!r} must be a local path (./, /, ~), a package 'org/name[@ref]', "
            "or a git checkout (set metadata['git_url'])"
        )
    warnings = () if (version or "latest") != "latest" else (
        f"package task {ref!r} uses the mutable ref 'latest'; pin a sha256 digest",
    )  # fmt: skip
    return PackageTaskId(org=org, name=task, ref=version or "latest"), warnings


def task_dir_under(root: Path, task_id: str) -> Path | None:
    """Dataset mode's task directory for ``task_id``: a directory strictly inside ``root``, else None.

    A Terminal-Bench task there (``task.yaml``) is given as its converted Harbor copy.
    """
    path = (root / task_id).resolve()
    if not (path.is_relative_to(root) and path != root and path.is_dir()):
        return None
    return as_harbor_task(path) if is_terminal_bench_task(path) else path


def declared_task(row: DatasetRow, sources: Sources) -> str | None:
    """The task a row names, before anything is resolved or fetched: what its result shows
    whatever happens to it (cancelled before it started included)."""
    ref = row.metadata.get("harbor_task")
    if ref:
        try:
            task_ref, _ = parse_task_ref(str(ref), row.metadata)
        except RowRejected:
            return str(ref)
        return task_ref.get_name() if isinstance(task_ref, PackageTaskId) else Path(str(ref)).name
    return sources.tasks_dir.name if sources.mode == "template" else row.task_id


class TaskResolver:
    """Resolves rows to task directories for one sweep run."""

    def __init__(self, sources: Sources, cache_dir: Path, logger: logging.Logger | logging.LoggerAdapter | None = None):
        self.sources = sources
        self.cache_dir = cache_dir
        self.logger = logger or logging.getLogger(__name__)
        self._fetches: dict[str, asyncio.Task[Path]] = {}
        self._client = TaskClient()

    def __getstate__(self) -> dict:
        """Shipped to another process (a Dask worker): in-flight fetches, the client and the run logger stay here."""
        return {**self.__dict__, "_fetches": {}, "_client": None, "logger": logging.getLogger(__name__)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._client = TaskClient()

    async def resolve(self, row: DatasetRow) -> ResolvedTask:
        ref = row.metadata.get("harbor_task")
        if ref:
            return await self._resolve_dynamic(str(ref), row.metadata)
        if self.sources.mode == "template":
            return ResolvedTask(name=self.sources.tasks_dir.name, path=self.sources.tasks_dir)
        task_id = row.task_id
        if not task_id:
            raise RowRejected("dataset mode needs metadata.harbor_task_id (a task directory under tasks_dir) or metadata.harbor_task")
        path = task_dir_under(self.sources.tasks_dir, task_id)
        if path is None:
            raise RowRejected(f"unknown harbor task id {task_id!r} (no such directory under {self.sources.tasks_dir})")
        return ResolvedTask(name=task_id, path=path)

    async def _resolve_dynamic(self, ref: str, metadata: dict) -> ResolvedTask:
        task_ref, warnings = parse_task_ref(ref, metadata)
        for warning in warnings:
            self.logger.warning(warning)
        policy = self.sources
        match task_ref:
            case LocalTaskId(path=path):
                path = path.resolve()
                roots = [self.sources.tasks_dir, *(Path(r).expanduser().resolve() for r in policy.allowed_local_roots)]
                if not any(path.is_relative_to(root) for root in roots):
                    raise RowRejected(
                        f"metadata.harbor_task: local path {path} is refused by the task source policy "
                        "(only tasks under tasks_dir or task_sources.allowed_local_roots may be named)"
                    )
                if not is_task(path):
                    raise RowRejected(f"metadata.harbor_task: {path} is not a Harbor task directory (no task.toml)")
                return ResolvedTask(name=path.name, path=path, dynamic=True, warnings=warnings)
            case GitTaskId(git_url=url):
                if not any(url.startswith(prefix) for prefix in policy.allowed_git_url_prefixes):
                    raise RowRejected(
                        f"metadata.git_url: {url} is refused by the task source policy "
                        "(add a matching prefix to task_sources.allowed_git_url_prefixes to allow it)"
                    )
            case PackageTaskId(org=org):
                if org not in policy.allowed_registry_orgs:
                    raise RowRejected(
                        f"metadata.harbor_task: registry org {org!r} is refused by the task source policy "
                        "(add it to task_sources.allowed_registry_orgs to allow it)"
                    )
        path = await self._fetch(task_ref)
        return ResolvedTask(name=task_ref.get_name(), path=path, dynamic=True, warnings=warnings)

    async def _fetch(self, task_ref: TaskRef) -> Path:
        """Download through Harbor's TaskClient, once per reference; concurrent rows share it."""
        key = task_ref.model_dump_json()
        if key not in self._fetches:
            self._fetches[key] = asyncio.ensure_future(self._download(task_ref))
        try:
            return await asyncio.shield(self._fetches[key])
        except RowRejected:
            raise
        except Exception as error:
            raise RowRejected(f"could not fetch task {task_ref.get_name()!r}: {type(error).__name__}: {error}") from error

    async def _download(self, task_ref: TaskRef) -> Path:
        self.logger.info(f"Fetching task {task_ref.get_name()} ({type(task_ref).__name__})")
        result = await self._client.download_tasks([task_ref], output_dir=self.cache_dir)
        return result.paths[0]
