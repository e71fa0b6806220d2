"""The trial's container: resources, prebuilt images, what of the host's environment it gets."""

import pytest
from harbor.models.task.config import EnvironmentConfig, NetworkMode

from tests.tasks_factory import BASE_IMAGE


async def test_task_resources_and_the_process_limit_are_applied(make_environment):
    env = make_environment(task_env=EnvironmentConfig(cpus=1, memory_mb=256), pids_limit=300)
    await env.start(force_build=False)
    try:
        limits = await env.exec(
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
            "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us; "
            "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
        )
    finally:
        await env.stop(delete=True)
    memory, cpu, pids = limits.stdout.split()[:3]
    assert int(memory) == 256 * 1024 * 1024
    assert cpu.startswith("100000")  # one CPU: a 100 ms quota per 100 ms period
    assert pids == "300"


async def test_a_prebuilt_docker_image_runs_without_a_dockerfile(make_environment):
    env = make_environment(task_env=EnvironmentConfig(docker_image=BASE_IMAGE))
    (env.environment_dir / "Dockerfile").unlink()
    await env.start(force_build=False)
    try:
        assert (await env.exec("cat /etc/debian_version")).return_code == 0
    finally:
        await env.stop(delete=True)
    assert env.image == BASE_IMAGE


async def test_the_hosts_proxy_settings_reach_the_trial_and_nothing_else_of_its_environment(make_environment, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", "localhost")
    monkeypatch.setenv("PREFECT_HARBOR_NOT_A_PROXY", "secret")
    env = make_environment()
    await env.start(force_build=False)
    try:
        seen = (await env.exec('echo "$HTTPS_PROXY|$no_proxy|${PREFECT_HARBOR_NOT_A_PROXY:-unset}"')).stdout.strip()
    finally:
        await env.stop(delete=True)
    assert seen == "http://proxy.invalid:3128|localhost|unset"


def test_an_allowlist_task_is_refused_naming_the_alternatives(make_environment):
    with pytest.raises(ValueError, match="allowlist.*'public'.*'no-network'.*type 'docker'"):
        make_environment(network_mode=NetworkMode.ALLOWLIST)


async def test_the_tasks_workdir_is_made_at_start_when_the_image_lacks_it_as_docker_run_w_does(make_environment):
    """podman 4.3 refuses --workdir for a folder the image lacks; Docker makes it (root's)."""
    env = make_environment(task_env=EnvironmentConfig(workdir="/srv/task/work"))
    await env.start(force_build=False)
    try:
        seen = (await env.exec("pwd; stat -c '%U %a' .; touch made-here && echo written")).stdout.split()
    finally:
        await env.stop(delete=True)
    assert seen == ["/srv/task/work", "root", "755", "written"]
