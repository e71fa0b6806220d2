"""The services of a multi-service compose task, run beside the main container in one podman pod.

Harbor's docker environment runs a compose project: each service in a container of its own
on the project's private network, where every service reaches the others by service name.
Here a trial's services are the containers of one pod that shares a single thing, the
network namespace of its infra container:

* **Names.** Every container gets its own ``/etc/hosts`` (writable, as under Docker) in
  which each service name is the pod's loopback, so ``main`` and its tests call
  ``http://api:8000`` as they would under compose, and ``localhost:8000`` works too (as in
  Harbor's own egress-controlled mode, where services share one namespace). A difference
  from compose: two services cannot listen on the same port. The file is copied in before
  each container starts, not a host mount: podman 4.3 drops a pod's ``--add-host`` entries
  on ``--network none``, and a mount would be a host file the agent could write.
* **Network policy.** The pod, not each container, is on the network: ``public`` trials'
  pods join the ``prefect-harbor`` bridge, their port isolated before any service starts
  (:mod:`.network`), so a trial's services are out of other trials' reach; ``no-network``
  pods have only loopback, over which the services still talk to each other.
* **Everything else is private** (pid, ipc, uts, mount namespaces): a service sees none of
  main's processes, main none of its services'. Each container gets the sandbox's seccomp
  profile, capability set and process limit.
* **Start-up is ``docker compose up --wait``:** services start in ``depends_on`` order, each
  once its dependencies meet their conditions (started, healthy, completed successfully),
  and start-up ends when every service with a healthcheck is healthy.
* ``podman pod rm --force`` removes the pod and every container in it; the pod and its
  containers carry the owner's label, so :mod:`.janitor` reaps them with their owner.
"""

from __future__ import annotations

import asyncio
import io
import logging
import tarfile
from collections.abc import Awaitable, Callable

from prefect_harbor.sandbox.compose import Healthcheck, Project, Service
from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC, Completed, EngineError, podman
from prefect_harbor.sandbox.limits import cgroupfs_manager, limit_cgroup
from prefect_harbor.sandbox.transfer import put_archive
from prefect_harbor.sandbox.workdir import start_creating_workdir

_LOG_TAIL_LINES = "30"
logger = logging.getLogger(__name__)
#: The pod's infra container and a monitor (conmon) per container count against the pod's limit too.
_POD_OVERHEAD_PIDS = 32

#: Starts one service's container in the pod and returns its id.
StartService = Callable[[Service], Awaitable[str]]


class ServiceStartError(RuntimeError):
    """A compose service exited, failed its healthcheck or its ``depends_on`` condition."""


class Pod:
    """One trial's pod: a network namespace its containers share, and nothing else."""

    def __init__(
        self, name: str, labels: dict[str, str], network: str, service_names: list[str], pids_limit: int | None = None, userns: str | None = None
    ) -> None:  # fmt: skip
        self.name = name
        self.labels = labels
        self.network = network
        self.service_names = service_names
        self.pids_limit = pids_limit
        self.userns = userns

    async def create(self) -> None:
        """Create the pod and start its infra container, which holds the network namespace."""
        args = ["pod", "create", "--name", self.name, "--infra-name", f"{self.name}-infra", "--share", "net", "--network", self.network]
        if self.userns:
            args += ["--userns", self.userns]
        for key, value in self.labels.items():
            args += ["--label", f"{key}={value}"]
        created = await podman(*args, timeout=STATE_CALL_TIMEOUT_SEC)
        if created.returncode != 0 and b"catatonit" in created.stderr:
            raise EngineError(
                "podman cannot build its pause image for a multi-service task's pod: catatonit is not installed "
                "(Debian/Ubuntu: apt-get install catatonit; or run `bash scripts/dev.sh setup`)."
            )
        created.check(f"creating pod {self.name}")
        if self.pids_limit is not None:
            await self._limit_processes(self.pids_limit)
        (await podman("pod", "start", self.name, timeout=STATE_CALL_TIMEOUT_SEC)).check(f"starting pod {self.name}")

    async def _limit_processes(self, pids_limit: int) -> None:
        """The trial's process limit on the pod's cgroup too, so its services share it rather than
        each having its own (room is left for the pod's infra and the containers' monitors)."""
        if not await asyncio.to_thread(cgroupfs_manager):
            return
        path = (await podman("pod", "inspect", "--format", "{{.CgroupPath}}", self.name)).check(f"inspecting pod {self.name}").text
        if not path or not await asyncio.to_thread(limit_cgroup, path, pids_limit + _POD_OVERHEAD_PIDS):
            logger.warning(f"Could not limit pod {self.name}'s processes as a whole: each of its containers keeps its own limit of {pids_limit}.")

    async def add(self, name: str, options: list[str], image: str, command: list[str], extra_hosts: list[tuple[str, str]]) -> str:
        """Create a container in the pod, give it its ``/etc/hosts`` (:func:`hosts_file`), start it; its id."""
        created = await podman("create", "--pod", self.name, "--name", name, "--no-hosts", *options, image, *command, timeout=STATE_CALL_TIMEOUT_SEC)
        container = created.check(f"creating container {name} from {image}").text
        hosts = hosts_file(self.service_names, container[:12], extra_hosts)  # the hostname is the short id, as under Docker
        await put_archive(container, _hosts_archive(hosts), f"writing /etc/hosts of {name}")
        started = await podman("start", container, timeout=STATE_CALL_TIMEOUT_SEC)
        started = await start_creating_workdir(container, started) or started  # its --workdir is not in the image
        started.check(f"starting container {name} from {image}")
        return container

    async def remove(self) -> Completed:
        """Remove the pod and every container in it at once (no grace period: nothing in it is kept)."""
        return await podman("pod", "rm", "--force", "--ignore", "--time", "0", self.name, timeout=STATE_CALL_TIMEOUT_SEC)


def hosts_file(names: list[str], hostname: str, extra_hosts: list[tuple[str, str]]) -> str:
    """A container's ``/etc/hosts``: loopback, its own hostname, every service name, its ``extra_hosts``."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"127.0.0.1\t{hostname}", f"127.0.0.1\t{' '.join(names)}"]
    lines += [f"{address}\t{host}" for host, address in extra_hosts]
    return "\n".join(lines) + "\n"


def _hosts_archive(text: str) -> bytes:
    """A tar stream holding ``etc/hosts`` (root's, mode 0644), for ``podman cp``."""
    data = text.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("etc/hosts")
        member.size, member.mode = len(data), 0o644
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


async def start_in_order(project: Project, start: StartService) -> dict[str, str]:
    """Start every service, main included, as ``docker compose up --wait`` does; service name -> container id.

    Each service starts once what it depends on meets its condition; then every service with
    a healthcheck must become healthy. A failure raises :class:`ServiceStartError` with the
    service's own output.
    """
    containers: dict[str, str] = {}
    healthy: set[str] = set()
    for service in project.start_order:
        for dependency, condition in service.depends_on.items():
            await _meet(project.service(dependency), containers[dependency], condition, healthy)
        containers[service.name] = await start(service)
    for service in project.start_order:
        if service.healthcheck and service.name not in healthy:
            await wait_healthy(containers[service.name], service.name, service.healthcheck)
    return containers


async def _meet(service: Service, container: str, condition: str, healthy: set[str]) -> None:
    if condition == "service_healthy" and service.name not in healthy:
        assert service.healthcheck is not None, "compose.load refuses service_healthy without a healthcheck"
        await wait_healthy(container, service.name, service.healthcheck)
        healthy.add(service.name)
    elif condition == "service_completed_successfully":
        await _wait_completed(container, service.name)


async def wait_healthy(container: str, name: str, check: Healthcheck) -> None:
    """Run the service's healthcheck until it passes; fail once Docker would call it unhealthy, or when the service exits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + check.deadline_sec
    while True:
        try:
            result = await podman("exec", container, *check.test, timeout=check.timeout_sec)
        except TimeoutError:
            result = Completed(124, b"", f"timed out after {check.timeout_sec:g} s".encode())
        if result.returncode == 0:
            return
        if not await _running(container):
            raise ServiceStartError(f"service {name!r} exited before its healthcheck passed. Its output:\n{await _logs(container)}")
        if loop.time() > deadline:
            output = (result.stdout + result.stderr).decode(errors="replace")[-1000:]
            raise ServiceStartError(
                f"service {name!r} did not become healthy within {check.deadline_sec:g} s ({' '.join(check.test)}); "
                f"last check said:\n{output}\nIts output:\n{await _logs(container)}"
            )
        await asyncio.sleep(check.poll_sec)


async def _wait_completed(container: str, name: str) -> None:
    """``service_completed_successfully``: the service ran to its end with exit code 0."""
    waited = (await podman("wait", container)).check(f"waiting for service {name!r}")
    if waited.text != "0":
        raise ServiceStartError(f"service {name!r} exited with code {waited.text}; services depend on it completing successfully. Its output:\n{await _logs(container)}")


async def _running(container: str) -> bool:
    state = await podman("inspect", "--format", "{{.State.Status}}", container)
    return state.text in ("running", "created", "configured")


async def _logs(container: str) -> str:
    logs = await podman("logs", "--tail", _LOG_TAIL_LINES, container)
    return (logs.stdout + logs.stderr).decode(errors="replace")[-2000:]
