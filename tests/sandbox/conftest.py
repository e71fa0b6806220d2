"""Build container environments for tests without a whole Harbor trial."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths
from tasks_factory import BASE_DOCKERFILE

from prefect_harbor.sandbox import ContainerEnvironment

MakeEnvironment = Callable[..., ContainerEnvironment]


@pytest.fixture
def make_environment(tmp_path: Path) -> MakeEnvironment:
    """A factory: ``make_environment(dockerfile=..., network_mode=..., allowed_hosts=..., files={path: text}, **env_kwargs)``;
    ``files`` are written into the environment folder first (a docker-compose.yaml, service contexts)."""
    counter = iter(range(1000))

    def make(
        dockerfile: str = BASE_DOCKERFILE,
        network_mode: NetworkMode = NetworkMode.PUBLIC,
        task_env: EnvironmentConfig | None = None,
        files: dict[str, str] | None = None,
        allowed_hosts: list[str] | None = None,
        **kwargs,
    ) -> ContainerEnvironment:
        n = next(counter)
        environment_dir = tmp_path / f"task{n}" / "environment"
        environment_dir.mkdir(parents=True)
        (environment_dir / "Dockerfile").write_text(dockerfile)
        for relative, text in (files or {}).items():
            (environment_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            (environment_dir / relative).write_text(text)
        trial_paths = TrialPaths(trial_dir=tmp_path / f"trial{n}")
        trial_paths.mkdir()
        return ContainerEnvironment(
            environment_dir=environment_dir,
            environment_name=f"selfcheck{n}",
            # Unique across test processes: tests find their trial's containers by this label.
            session_id=f"selfcheck{n}-{secrets.token_hex(3)}__env",
            trial_paths=trial_paths,
            task_env_config=task_env or EnvironmentConfig(network_mode=network_mode, allowed_hosts=allowed_hosts),
            network_policy=NetworkPolicy(network_mode=network_mode, allowed_hosts=allowed_hosts or []),
            **kwargs,
        )

    return make


@pytest.fixture
async def environment(make_environment: MakeEnvironment) -> AsyncIterator[ContainerEnvironment]:
    env = make_environment()
    await env.start(force_build=False)
    try:
        yield env
    finally:
        await env.stop(delete=True)
