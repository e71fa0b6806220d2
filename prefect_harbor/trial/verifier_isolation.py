"""``verifier_isolation = "separate"``: a shared-mode task verified the way Harbor verifies a separate one.

In Harbor's shared mode the verifier runs in the agent's container, with whatever the agent
left running and whatever programs it replaced (``sandbox/verifier_watch.py`` records evidence
of that, but cannot prevent it). This option rewrites the row's private copy of the task so
Harbor verifies it in a container of its own instead: ``[verifier] environment_mode =
"separate"`` (a fresh container of the task's own image, the tests uploaded into it), with the
task's working folder (``[environment] workdir``, else the last ``WORKDIR`` of its Dockerfile's
final stage), or the backend's ``verifier_artifacts``, declared as ``artifacts``: copied out of
the agent's container once it is done, then into the verifier's, as data (links leading out,
special files and set-id bits dropped).

What it breaks, by design: tests that need what the agent left running (a server), what it
installed or wrote outside the copied paths, or the state of compose services (the verifier
gets fresh ones). What it cannot do: make tests that *run* code from the copied paths safe
from it (README, "Not covered").
"""

from __future__ import annotations

from pathlib import Path

from harbor.models.task.config import TaskConfig, VerifierEnvironmentMode
from harbor.models.task.verifier_mode import resolve_step_verifier_mode, resolve_task_verifier_mode

from prefect_harbor.rows.sources import RowRejected
from prefect_harbor.sandbox.dockerfile import final_workdir


def isolate_verifier(task_dir: Path, task_name: str, paths: list[str]) -> list[str]:
    """Rewrite ``task_dir``'s task.toml so its shared verifiers run separately with ``paths``
    (default: the task's workdir) as artifacts; the paths copied (none when it had no shared verifier)."""
    toml = task_dir / "task.toml"
    config = TaskConfig.model_validate_toml(toml.read_text())
    shared_steps = [step for step in config.steps or [] if resolve_step_verifier_mode(config, step) == VerifierEnvironmentMode.SHARED]
    if not shared_steps and (config.steps or resolve_task_verifier_mode(config) != VerifierEnvironmentMode.SHARED):
        return []
    copied = list(paths) or [_workdir(task_dir, config, task_name)]
    if config.steps:
        for step in shared_steps:
            step.verifier.environment_mode = VerifierEnvironmentMode.SEPARATE
            step.artifacts = [*step.artifacts, *(path for path in copied if path not in step.artifacts)]
    else:
        config.verifier.environment_mode = VerifierEnvironmentMode.SEPARATE
        config.artifacts = [*config.artifacts, *(path for path in copied if path not in config.artifacts)]
    toml.write_text(config.model_dump_toml())
    return copied


def _workdir(task_dir: Path, config: TaskConfig, task_name: str) -> str:
    if config.environment.workdir:
        return config.environment.workdir
    dockerfile = task_dir / "environment" / "Dockerfile"
    if dockerfile.is_file() and (workdir := final_workdir(dockerfile.read_text())):
        return workdir
    raise RowRejected(
        f"task {task_name!r}: verifier_isolation 'separate' copies the task's working folder into its verifier, and it names none "
        "([environment] workdir in task.toml, or a WORKDIR in its Dockerfile's final stage); list the paths to copy in the backend's verifier_artifacts"
    )
