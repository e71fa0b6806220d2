"""Harbor 0.25's separate verifiers, as the local sandbox runs them.

A task with ``[verifier] environment_mode = "separate"`` (or a ``[verifier.environment]``,
which implies it; a step may set its own) is verified in an environment of its own. Harbor's
trial drives it (``Trial._run_separate_verifier``): once the agent's phase is over it runs the
task's ``[[verifier.collect]]`` commands in their services, copies every declared artifact
(top-level ``artifacts``, a step's, and the ``/logs/artifacts`` folder) out of the agent's
containers onto the host, stops the agent's environment, and only then creates a second
environment of this class, whose ``environment_dir`` is

* the task's ``tests/`` when it holds a ``Dockerfile`` (or ``docker-compose.yaml``), or when
  ``[verifier.environment] docker_image`` names an image: **the verifier's own image**, which
  brings its tests (usually ``COPY . /tests/``). Harbor says so by turning the environment
  folder's upload off (``enable_environment_dir_upload=False``) and uploads no tests;
* otherwise ``environment/``: **a fresh copy of the task's environment**, into which Harbor
  uploads the tests, as for a shared verifier (here into the read-only ``/tests`` mount).

Into that container Harbor copies each artifact back to its original path, as data: a tar
copy that drops links leading out of the artifact, special files and set-id bits. The
verifier's container shares nothing else with the agent's: not their processes (stopped),
file systems, network namespace or host mounts (Harbor gives it none).

What the sandbox adds: a verifier image that brings its tests gets no empty ``/tests`` mount
over them (:func:`owns_its_tests`) and none of the agent's baked bundle; prewarm and
``prefect-harbor check`` build or check each verifier's image with the task's own
(:func:`verifier_environments`), so a verifier that cannot be built fails its rows before
any agent runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harbor.models.task.config import TaskConfig
from harbor.models.task.paths import TaskPaths
from harbor.models.task.verifier_mode import VerifierEnvironmentDefinition, resolve_verifier_environment_definition


def owns_its_tests(environment_kwargs: Mapping[str, Any]) -> bool:
    """Whether Harbor is creating a separate verifier's own image, which brings ``/tests``
    (``enable_environment_dir_upload=False`` is how its trial says so)."""
    return environment_kwargs.get("enable_environment_dir_upload", True) is False


def verifier_environments(task_dir: Path, config: TaskConfig) -> list[VerifierEnvironmentDefinition]:
    """Each distinct environment the task's separate verifiers run in (the task's, or each
    step's), resolved as Harbor's trial resolves them; empty when every verifier is shared."""
    paths = TaskPaths(task_dir)
    found: dict[tuple[Path, str | None, bool], VerifierEnvironmentDefinition] = {}
    for step in config.steps or [None]:
        definition = resolve_verifier_environment_definition(config, paths, step)
        if definition is not None:
            found.setdefault((definition.directory, definition.config.docker_image, definition.bundled_tests), definition)
    return list(found.values())


def verifier_image_kwargs(environment_kwargs: Mapping[str, Any], definition: VerifierEnvironmentDefinition) -> dict[str, Any]:
    """The environment options a verifier's image is made with: the trial's, less the agent's
    baked bundle when the image is the verifier's own (it runs nothing of the agent's)."""
    kwargs = dict(environment_kwargs)
    if definition.bundled_tests:
        kwargs.pop("baked_paths", None)
    return kwargs
