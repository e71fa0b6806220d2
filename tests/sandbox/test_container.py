"""The trial's container: resources, prebuilt images, what of the host's environment it gets."""

import uuid
from pathlib import Path

import psutil
import pytest
from harbor.models.task.config import EnvironmentConfig
from tasks_factory import BASE_DOCKERFILE, BASE_IMAGE

from prefect_harbor.sandbox import engine_service
from prefect_harbor.sandbox.engine import podman

#: Each test starts podman (builds, containers): the integration tier.
pytestmark = pytest.mark.integration


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


def exec_conmons(container_id: str) -> list[list[str]]:
    """The command lines of the conmons podman keeps for ``container_id``'s exec sessions."""
    return [
        argv
        for process in psutil.process_iter(["name", "cmdline"])
        if process.info["name"] == "conmon" and "--exec-attach" in (argv := process.info["cmdline"] or []) and container_id in argv
    ]


async def test_an_execs_conmon_is_kept_30_s_after_it_ends_not_docker_s_5_minutes(make_environment):
    """The sandbox reads an exec's exit status when its output ends; podman's 300 s default made a
    busy host carry hundreds of idle conmons, which every scan of /proc paid for (containers.conf)."""
    env = make_environment()
    await env.start(force_build=False)
    try:
        assert (await env.exec("true")).return_code == 0
        container_id = env._container
        assert container_id is not None
        kept = exec_conmons(container_id)
    finally:
        await env.stop(delete=True)
    assert kept, "no exec conmon found: podman's exec bookkeeping changed, so this test no longer says anything"
    delays = {argv[argv.index("--exit-delay") + 1] for argv in kept}
    assert delays == {"30"}, delays


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


async def test_the_tasks_workdir_is_made_at_start_when_the_image_lacks_it_as_docker_run_w_does(make_environment):
    """podman 4.3 refuses --workdir for a folder the image lacks; Docker makes it (root's)."""
    env = make_environment(task_env=EnvironmentConfig(workdir="/srv/task/work"))
    await env.start(force_build=False)
    try:
        seen = (await env.exec("pwd; stat -c '%U %a' .; touch made-here && echo written")).stdout.split()
    finally:
        await env.stop(delete=True)
    assert seen == ["/srv/task/work", "root", "755", "written"]


async def test_a_log_file_growing_during_the_copy_loses_none_of_the_files_after_it(make_environment, tmp_path):
    """podman's copier ends its archive, well formed, at a file that grows while it is read: a process
    the agent left appending to /logs/verifier/a.txt made the verifier's reward.txt vanish from the copy."""
    env = make_environment()
    await env.start(force_build=False)
    try:
        await env.exec("mkdir -p /logs/verifier && echo 0 > /logs/verifier/reward.txt && echo ran > /logs/verifier/test-stdout.txt")
        await env.exec("nohup sh -c 'while :; do echo forging >> /logs/verifier/a.txt; done' > /dev/null 2>&1 &")
        await env.exec("while [ $(stat -c %s /logs/verifier/a.txt 2>/dev/null || echo 0) -lt 100000 ]; do sleep 0.1; done")
        for attempt in range(3):  # each copy would be cut (the file grows by megabytes a second)
            await env.download_dir("/logs/verifier", tmp_path / f"copy-{attempt}")
        still_writing = (await env.exec("s=$(stat -c %s /logs/verifier/a.txt); sleep 0.5; [ $(stat -c %s /logs/verifier/a.txt) -gt $s ] && echo yes")).stdout
    finally:
        await env.stop(delete=True)
    assert still_writing.strip() == "yes", "the container was left paused after the copy"
    for attempt in range(3):
        copied = tmp_path / f"copy-{attempt}"
        assert sorted(path.name for path in copied.iterdir()) == ["a.txt", "reward.txt", "test-stdout.txt"], attempt
        assert (copied / "reward.txt").read_text() == "0\n"


async def test_an_upload_leaves_no_copy_of_itself_in_the_hosts_var_tmp(make_environment, tmp_path):
    """podman 4.3's `cp -` keeps each archive it reads from stdin in its TMPDIR: every upload (tests, solutions, logs) piled up in /var/tmp."""
    marker = f"upload-{uuid.uuid4().hex}"
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "file.txt").write_text(marker)
    env = make_environment()
    await env.start(force_build=False)
    try:
        await env.upload_dir(tmp_path / "up", "/srv/up")
        seen = (await env.exec("cat /srv/up/file.txt")).stdout
    finally:
        await env.stop(delete=True)
    assert seen == marker
    leaked = [path for path in Path("/var/tmp").iterdir() if path.is_file() and marker.encode() in path.read_bytes()[:1 << 20]]
    assert not leaked, leaked


async def test_with_userns_auto_the_trials_root_is_not_the_hosts_root_and_user_tasks_still_work(make_environment):
    """Measured for issue 26 (opt-in, README "Isolation"): a user namespace per trial, files copied in and out as usual."""
    env = make_environment(dockerfile=BASE_DOCKERFILE + "RUN useradd --create-home agent\n", userns="auto")
    await env.start(force_build=False)
    try:
        host_user = (await podman("top", env.container_id, "huser")).check("top").text.split()[1:]
        as_agent = await env.exec("id -un && touch /home/agent/written && echo ok", user="agent")
        await env.exec("mkdir -p /tmp/out && echo from-root > /tmp/out/out.txt", user="root")
        await env.download_dir("/tmp/out", env.trial_paths.agent_dir)
    finally:
        await env.stop(delete=True)
    assert host_user and "0" not in host_user and "root" not in host_user, host_user
    assert as_agent.stdout.split() == ["agent", "ok"], as_agent
    assert (env.trial_paths.agent_dir / "out.txt").read_text() == "from-root\n"


def test_userns_other_than_auto_is_refused_naming_the_option(make_environment):
    with pytest.raises(ValueError, match="userns: 'host' is not supported; give 'auto'"):
        make_environment(userns="host")


async def test_the_engine_services_own_environment_reaches_no_exec(make_environment, monkeypatch):
    """The service runs with the host's environment (as podman commands do); an exec gets the container's and the trial's only."""
    service = engine_service._Service()
    monkeypatch.setattr(engine_service, "_SERVICE", service)
    monkeypatch.setenv("PREFECT_HARBOR_SERVICE_SECRET", "must-not-leak")  # in the service's environment from its start
    env = make_environment()
    await env.start(force_build=False)
    try:
        seen = (await env.exec('echo "${PREFECT_HARBOR_SERVICE_SECRET:-unset}"; cat /proc/1/environ | tr "\\0" "\\n"')).stdout
    finally:
        await env.stop(delete=True)
        service.stop()
    assert "must-not-leak" not in seen and seen.startswith("unset"), seen
