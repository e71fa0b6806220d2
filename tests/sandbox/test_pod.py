"""Multi-service compose tasks: the services run beside main in one pod, are reached by name,
are isolated as main is, keep to the trial's network policy, and are gone after stop."""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harbor.models.task.config import NetworkMode
from tasks_factory import API_COMPOSE, API_FILES, BASE_IMAGE, FETCH

from prefect_harbor.sandbox.engine import LABEL_OWNER, LABEL_TRIAL, podman, podman_sync
from prefect_harbor.sandbox.janitor import reap_orphans
from prefect_harbor.sandbox.network import gateway_address
from prefect_harbor.sandbox.owners import owner_token
from prefect_harbor.sandbox.pod import Pod, ServiceStartError

pytestmark = pytest.mark.integration

#: api (built from its context) must be healthy and seed (an image) must have succeeded before main starts.
COMPOSE = """services:
  main:
    depends_on:
      api: {condition: service_healthy}
      seed: {condition: service_completed_successfully}
  api:
    build: ./api
    command: python3 -m http.server 8000 --directory /srv
    healthcheck:
      test: [CMD, python3, -c, "import urllib.request; urllib.request.urlopen('http://localhost:8000/answer.txt', timeout=2)"]
      interval: 1s
      retries: 20
  seed:
    image: debian:bookworm-slim
    command: [sh, -c, "grep -qw api /etc/hosts"]
"""
#: This container's address on its network (the route out's source; nothing is sent).
OWN_ADDRESS = "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('192.0.2.255', 9)); print(s.getsockname()[0])\""


def knock(host: str, port: int = 8000) -> str:
    """A shell command printing ``reached`` or ``refused: <error>`` for a TCP connection to ``host:port``."""
    return (
        f"python3 -c \"import socket\ntry:\n    socket.create_connection(('{host}', {port}), timeout=2).close(); print('reached')\n"
        f"except OSError as e:\n    print('refused:', e)\""
    )


def reach_from_host(address: str, port: int, deadline: float = 90) -> None:
    """Connect from the host to ``address:port``, trying again until ``deadline`` seconds pass.

    A fresh container can take an address a removed one had; until the host's neighbour entry
    for it is probed again (several seconds, longer on a busy machine) the host's packets go to
    the old interface and a single short connect times out."""
    give_up = time.monotonic() + deadline
    while True:
        try:
            socket.create_connection((address, port), timeout=5).close()
            return
        except OSError:
            if time.monotonic() > give_up:
                raise
            time.sleep(1)


async def fetch(env, url: str) -> str:
    result = await env.exec(FETCH, env={"URL": url})
    return (result.stdout + result.stderr).strip()


async def test_main_reaches_its_services_by_name_and_stop_removes_every_one(make_environment):
    env = make_environment(files={**API_FILES, "docker-compose.yaml": COMPOSE}, pids_limit=321)
    await env.start(force_build=False)
    try:
        services = env.service_containers
        assert await fetch(env, "http://api:8000/answer.txt") == "42"
        assert await fetch(env, "http://localhost:8000/answer.txt") == "42", "the pod's services share its loopback"
        processes = (await env.exec("ps -eo args")).stdout
        assert "http.server" not in processes, "main sees its services' processes"
        inspected = (await podman("inspect", "--format", "{{.HostConfig.PidsLimit}} {{.HostConfig.Binds}} {{.HostConfig.SecurityOpt}}", services["api"])).text
        assert inspected.startswith("321 [] ") and "seccomp=" in inspected, inspected
        pod = env._pod.name
        cgroup = (await podman("pod", "inspect", "--format", "{{.CgroupPath}}", pod)).text
        assert Path(f"/sys/fs/cgroup/pids{cgroup}/pids.max").read_text().strip() == str(321 + 32), "the pod as a whole has no process limit"
    finally:
        await env.stop(delete=True)
    assert set(services) == {"api", "seed"}
    assert podman_sync("pod", "exists", pod).returncode == 1
    assert podman_sync("ps", "-a", "--filter", f"label={LABEL_TRIAL}={env.session_id}", "--format", "{{.Names}}").text == ""


async def test_a_no_network_trials_services_talk_over_loopback_and_nothing_else(make_environment):
    env = make_environment(files={**API_FILES, "docker-compose.yaml": API_COMPOSE}, network_mode=NetworkMode.NO_NETWORK)
    await env.start(force_build=False)
    try:
        assert await fetch(env, "http://api:8000/answer.txt") == "42"
        interfaces = (await env.exec("tail -n +3 /proc/net/dev | cut -d: -f1")).stdout.split()
        outside = (await env.exec(knock(gateway_address(), 53))).stdout
    finally:
        await env.stop(delete=True)
    assert interfaces == ["lo"]
    assert outside.startswith("refused:"), outside


async def test_a_trial_cannot_reach_another_trials_services(make_environment):
    """The hostile neighbour: B's agent, and B's own service, try A's service on the bridge."""
    files = {**API_FILES, "docker-compose.yaml": API_COMPOSE}
    first, second = make_environment(files=files), make_environment(files=files)
    await asyncio.gather(first.start(force_build=False), second.start(force_build=False))
    try:
        address = (await first.exec(OWN_ADDRESS)).stdout.strip()
        await asyncio.to_thread(reach_from_host, address, 8000)  # A's service does listen on the bridge
        from_agent = (await second.exec(knock(address))).stdout.strip()
        from_service = (await podman("exec", second.service_containers["api"], "sh", "-c", knock(address))).text
        own = await fetch(second, "http://api:8000/answer.txt")
    finally:
        await asyncio.gather(first.stop(delete=True), second.stop(delete=True))
    assert from_agent.startswith("refused:"), from_agent
    assert from_service.startswith("refused:"), from_service
    assert own == "42"


async def test_harbors_sidecar_operations_reach_a_service_and_main_can_be_stopped_first(make_environment, tmp_path):
    """Harbor's collect hooks and sidecar artifacts: exec in a service, copy from it, stop main before collecting."""
    env = make_environment(files={**API_FILES, "docker-compose.yaml": API_COMPOSE})
    await env.start(force_build=False)
    try:
        hook = await env.service_exec("mkdir -p /evidence && echo seen > /evidence/log.txt && pwd", service="api", cwd="/srv")
        await env.stop_service("main")
        main_after = await podman("inspect", "--format", "{{.State.Status}}", env.container_id)
        await env.service_download_file("/evidence/log.txt", tmp_path / "file" / "log.txt", service="api")
        await env.service_download_dir("/evidence", tmp_path / "dir", service="api")
        with pytest.raises(RuntimeError, match="no compose service 'db' is running"):
            await env.service_exec("true", service="db")
    finally:
        await env.stop(delete=True)
    assert (hook.return_code, hook.stdout.strip()) == (0, "/srv")
    assert main_after.text == "exited"
    assert (tmp_path / "file" / "log.txt").read_text() == (tmp_path / "dir" / "log.txt").read_text() == "seen\n"


async def test_a_service_that_dies_fails_the_start_with_its_output_and_leaves_nothing(make_environment):
    compose = API_COMPOSE.replace("command: python3 -m http.server 8000 --directory /srv", 'command: [sh, -c, "echo no database here >&2; exit 3"]')
    env = make_environment(files={**API_FILES, "docker-compose.yaml": compose})
    with pytest.raises(ServiceStartError, match="service 'api' exited before its healthcheck passed(.|\n)*no database here"):
        await env.start(force_build=False)
    assert podman_sync("ps", "-a", "--filter", f"label={LABEL_TRIAL}={env.session_id}", "--format", "{{.Names}}").text == ""
    await env.stop(delete=True)


async def test_the_janitor_reaps_the_pod_of_a_dead_owner():
    # Owned by a live process while it is made (a sweep running beside this test, under
    # pytest-xdist, reaps dead owners' pods too), then the owner dies.
    owner = subprocess.Popen(["sleep", "600"])
    token = owner_token(owner.pid)
    pod = Pod(f"ph-test-orphan-{os.getpid()}", {LABEL_OWNER: token, LABEL_TRIAL: "orphan"}, "none", ["main"])
    await pod.create()
    await pod.add(f"{pod.name}-main", ["--label", f"{LABEL_OWNER}={token}"], BASE_IMAGE, ["sleep", "infinity"], [])
    owner.kill()
    owner.wait()
    await asyncio.to_thread(reap_orphans)  # this call, or a concurrent sweep's: the janitor's either way
    assert podman_sync("pod", "exists", pod.name).returncode == 1
    assert podman_sync("container", "exists", f"{pod.name}-main").returncode == 1


#: An owner process: arms its watchdog, creates a pod with its own owner label, waits to be killed.
OWNER = """
import asyncio, sys, time
from prefect_harbor.sandbox import janitor
from prefect_harbor.sandbox.engine import LABEL_OWNER
from prefect_harbor.sandbox.pod import Pod
janitor.ensure_watchdog()
asyncio.run(Pod(sys.argv[1], {LABEL_OWNER: janitor.owner_token()}, "none", ["main"]).create())
print("ready", flush=True)
time.sleep(600)
"""


async def test_the_watchdog_removes_the_pod_of_an_owner_killed_with_sigkill():
    name = f"ph-test-watchdog-{os.getpid()}"
    owner = await asyncio.create_subprocess_exec(sys.executable, "-c", OWNER, name, stdout=asyncio.subprocess.PIPE)
    try:
        assert (await asyncio.wait_for(owner.stdout.readline(), 120)) == b"ready\n"
        assert podman_sync("pod", "exists", name).returncode == 0
    finally:
        owner.kill()
        await owner.wait()
    for _ in range(300):
        if podman_sync("pod", "exists", name).returncode == 1:
            return
        await asyncio.sleep(0.2)
    podman_sync("pod", "rm", "-f", "-t", "0", name)
    pytest.fail(f"pod {name} outlived its owner by 60 s")


async def test_a_compose_working_dir_the_image_lacks_is_made_at_start_in_main_and_in_a_service(make_environment):
    compose = API_COMPOSE.replace("  main:\n", "  main:\n    working_dir: /srv/main-work\n").replace(
        "    command: python3", "    working_dir: /srv/api-work\n    command: python3"
    )
    env = make_environment(files={**API_FILES, "docker-compose.yaml": compose})
    await env.start(force_build=False)
    try:
        main_cwd = (await env.exec("pwd")).stdout.strip()
        api_cwd = (await podman("exec", env.service_containers["api"], "pwd")).text
    finally:
        await env.stop(delete=True)
    assert (main_cwd, api_cwd) == ("/srv/main-work", "/srv/api-work")


async def test_a_host_path_a_compose_file_mounts_is_an_empty_folder_in_the_trial(make_environment, tmp_path):
    """Docker would mount the host's folder; here the trial gets an empty one at the target, and the host's files stay out."""
    host = tmp_path / "credentials"
    host.mkdir()
    (host / "secret.json").write_text("host-only")
    compose = f"services:\n  main:\n    volumes:\n      - {host}:/root/.config/gcloud:ro\n      - {host}:/srv/cache\n"
    env = make_environment(files={"docker-compose.yaml": compose})
    await env.start(force_build=False)
    try:
        listed = await env.exec("ls -A /root/.config/gcloud /srv/cache; echo written > /srv/cache/new && cat /srv/cache/new; touch /root/.config/gcloud/x")
    finally:
        await env.stop(delete=True)
    assert listed.stdout.split() == ["/root/.config/gcloud:", "/srv/cache:", "written"], listed
    assert "Read-only file system" in (listed.stderr or ""), listed
    assert sorted(path.name for path in host.iterdir()) == ["secret.json"] and (host / "secret.json").read_text() == "host-only"


async def test_a_services_hosts_file_is_roots_and_leaves_nothing_in_the_hosts_var_tmp(make_environment):
    """podman 4.3's `cp -` keeps every archive it reads from stdin in /var/tmp: some 12,000 had piled up."""
    env = make_environment(files={**API_FILES, "docker-compose.yaml": API_COMPOSE})
    await env.start(force_build=False)
    try:
        hosts = await podman("exec", env.service_containers["api"], "stat", "-c", "%U %a", "/etc/hosts")
        short_id = env.service_containers["api"][:12]
        named = (await podman("exec", env.service_containers["api"], "cat", "/etc/hosts")).text
    finally:
        await env.stop(delete=True)
    assert hosts.text == "root 644" and f"127.0.0.1\t{short_id}" in named, (hosts.text, named)
    leaked = [path for path in Path("/var/tmp").iterdir() if path.is_file() and short_id.encode() in path.read_bytes()[:20480]]
    assert not leaked, leaked
