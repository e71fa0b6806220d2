"""Bubblewrap-specific behaviour beyond the shared self-check suite."""

import pytest
from harbor.models.task.config import EnvironmentConfig, NetworkMode

from prefect_harbor.sandbox import UnsupportedDockerfileError


def test_a_dockerfile_with_run_lines_is_refused_before_start(make_environment):
    with pytest.raises(UnsupportedDockerfileError, match="line 2: RUN pip install numpy"):
        make_environment(dockerfile="FROM python:3.12\nRUN pip install numpy\n")


async def test_unsupported_lines_can_be_ignored_explicitly(make_environment):
    env = make_environment(
        dockerfile="FROM python:3.12\nRUN pip install numpy\nWORKDIR /data\n",
        ignore_unsupported_dockerfile_instructions=True,
    )
    await env.start(force_build=False)
    try:
        assert (await env.exec("pwd")).stdout.strip() == "/data"
    finally:
        await env.stop(delete=True)


def test_allowlist_networks_are_refused_with_the_alternatives(make_environment):
    with pytest.raises(ValueError, match="allowlist.*'public'.*'no-network'"):
        make_environment(network_mode=NetworkMode.ALLOWLIST)


def test_compose_tasks_are_refused(make_environment, tmp_path):
    env = make_environment()
    (env.environment_dir / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(ValueError, match="multi-container"):
        env._validate_definition()


async def test_dockerfile_workdir_env_and_user_apply_to_execs(make_environment):
    env = make_environment(dockerfile="FROM debian\nWORKDIR /srv/app\nENV GREETING=hello\nUSER nobody\n")
    await env.start(force_build=False)
    try:
        result = await env.exec('echo "$(pwd) $GREETING $(id -u)"')
        assert result.stdout.strip() == "/srv/app hello 65534"
    finally:
        await env.stop(delete=True)


async def test_task_workdir_and_env_win_over_the_dockerfile(make_environment):
    env = make_environment(
        dockerfile="FROM debian\nWORKDIR /srv/app\n",
        task_env=EnvironmentConfig(workdir="/work", env={"TASK_VAR": "task"}),
    )
    await env.start(force_build=False)
    try:
        assert (await env.exec('echo "$(pwd) $TASK_VAR"')).stdout.strip() == "/work task"
    finally:
        await env.stop(delete=True)


def test_unknown_users_are_named(make_environment):
    env = make_environment()
    with pytest.raises(ValueError, match="unable to find user 'no-such-user'"):
        env.identity("no-such-user")


async def test_stop_without_delete_keeps_the_private_tree(make_environment):
    env = make_environment()
    await env.start(force_build=False)
    await env.exec("echo kept > /tmp/kept.txt")
    state_dir = env.state_dir
    await env.stop(delete=False)
    assert (state_dir / "root" / "tmp" / "kept.txt").read_text() == "kept\n"


