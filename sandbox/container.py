"""A Harbor environment that runs each trial in one OCI container (and its compose services
beside it), built and run by podman.

No daemon: ``podman`` is a CLI that forks the container's runtime (runc) and a small
monitor (conmon) per container. Per trial:

* ``start()`` builds the task's image from its own Dockerfile (or resolves its
  ``docker_image``), cached by content (:mod:`.images`), and runs ONE long-lived container
  from it: the image's ENTRYPOINT with Harbor's keep-alive command, as Harbor's docker
  environment does. Each ``exec`` is a ``podman exec`` into it (:mod:`.container_exec`), so
  tmux servers and daemons survive from one exec to the next.
* Isolation is the engine's: its own user-visible root filesystem (writable, as under
  Docker), pid/ipc/uts/mount/network namespaces, the default seccomp profile, a reduced
  capability set, ``/proc/sys`` read-only and the usual ``/proc`` paths masked, a process
  limit. ``public`` tasks get a bridge network with NAT (the host's loopback is not
  reachable), ``no-network`` tasks only ``lo``.
* Harbor's ``/logs`` directories are NOT host mounts: Harbor copies them out after each
  phase through :mod:`.transfer`, which refuses links out of the trial. The only host
  paths inside are the read-only mounts a trial asks for (prepared agent environments)
  and ``/tests``.
* ``/tests`` is a read-only mount of an empty host folder while the agent works; the
  verifier's upload attaches a fresh, writable copy of the task's tests over it in one step
  (:mod:`.verifier_tests`), so nothing in the container (not root, not a process the agent
  left running) can read them early or plant files in them before they run
  (``protect_tests``). A separate verifier's own image (built from the task's ``tests/``)
  brings its tests, and gets no such mount over them (:mod:`.separate_verifier`).
* A compose task with services beside ``main`` (:mod:`.compose`) runs as one pod
  (:mod:`.pod`): each service in a container of its own, all sharing the pod's network
  namespace, where every service name resolves to the pod's loopback. The pod, not a
  container, joins the trial's network, so the policy above holds for all of them.
  Harbor's per-service operations (``service_exec``, ``service_download_*``,
  ``stop_service``: collect hooks and sidecar artifacts) reach the service's container, through
  Harbor's own main-or-service dispatch (``ComposeServiceOpsMixin``).
* ``stop()`` removes the container (or the pod and every service in it); :mod:`.janitor`
  removes them if this process dies first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, override

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.compose_service_ops import ComposeServiceOpsMixin, ComposeServiceTransport
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from prefect_harbor.sandbox import connections, egress, janitor, pod, transfer, workdir
from prefect_harbor.sandbox.compose import MAIN, TESTS_DIR, Service
from prefect_harbor.sandbox.container_exec import exec_in
from prefect_harbor.sandbox.container_view import ContainerRoot
from prefect_harbor.sandbox.engine import LABEL_OWNER, LABEL_SERVICE, LABEL_TRIAL, STATE_CALL_TIMEOUT_SEC, EngineError, env_file_options, podman, podman_path
from prefect_harbor.sandbox.engine_service import remove_container
from prefect_harbor.sandbox.images import EnvironmentImages, check_environment_definition, image_resolver
from prefect_harbor.sandbox.interpolation import ComposeVariables
from prefect_harbor.sandbox.limits import DEFAULT_PIDS_LIMIT
from prefect_harbor.sandbox.network import ensure_network, isolate_ports
from prefect_harbor.sandbox.proxy import container_proxy_variables
from prefect_harbor.sandbox.seccomp import DEFAULT_SECCOMP_PROFILE, seccomp_options
from prefect_harbor.sandbox.separate_verifier import owns_its_tests
from prefect_harbor.sandbox.trial_report import TrialReport
from prefect_harbor.sandbox.verifier_tests import VerifierTests
from prefect_harbor.sandbox.verifier_watch import DEFAULT_WATCH_SEC, VERIFIER_DIR, VerifierWatch

#: The import path to give Harbor: ``EnvironmentConfig(import_path=IMPORT_PATH)``.
IMPORT_PATH = "prefect_harbor.sandbox.container:ContainerEnvironment"
#: Harbor's docker environment keeps the main container alive with exactly this command.
KEEP_ALIVE = ("sh", "-c", "sleep infinity")
DEFAULT_MAX_COPY_MB = 1024
#: Harbor's log folders: host mounts under Docker, copies here (:func:`_still_for`).
LOGS_DIR = PurePosixPath("/logs")
#: Every kind of allowed_hosts entry Harbor knows: the proxy (:mod:`.egress`) checks each.
_ALLOWLIST_CAPABILITIES = tuple(
    f"network_allowlist{kind}" for kind in ("", "_hostnames", "_wildcard_hostnames", "_ipv4_addresses", "_ipv6_addresses", "_ipv4_cidrs", "_ipv6_cidrs")
)
#: A task without ``memory_mb`` would otherwise have no limit, and could take the host's memory.
DEFAULT_MEMORY_MB = 4096


class ContainerEnvironment(ComposeServiceOpsMixin, BaseEnvironment):
    """One podman container per trial; see the module docstring for the design."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        base_images: dict[str, str] | None = None,
        extra_ca_certs: list[str] | None = None,
        pull: bool = True,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        max_parallel_builds: int = 2,
        baked_paths: list[dict] | None = None,
        max_copy_mb: int = DEFAULT_MAX_COPY_MB,
        default_memory_mb: int = DEFAULT_MEMORY_MB,
        protect_tests: bool = True,
        userns: str | None = None,
        task_env_passthrough: list[str] | None = None,
        verifier_watch_sec: float = DEFAULT_WATCH_SEC,
        build_timeout_multiplier: float = 1.0,
        **kwargs: Any,
    ):
        """Extra options (``EnvironmentConfig.kwargs``):

        base_images: image references mapped to local stand-ins, used (with a warning)
            when the real base cannot be pulled, e.g. ``{"ubuntu:24.04": "debian:bookworm"}``.
        extra_ca_certs: PEM files added to each image's trust store at build time (for
            intercepting proxies); default: the host's ``/usr/local/share/ca-certificates``.
        pull: try the registry for bases not in local storage.
        pids_limit: the most processes one trial may have.
        max_parallel_builds: image builds at once on this host (they are CPU- and disk-bound).
        default_memory_mb: the memory limit of a task that sets no ``memory_mb``.
        max_copy_mb: the most one copy out of the container (a log folder) may write on the host.
        baked_paths: ``{"source", "target"}`` host files and folders copied into the image at
            build time (``patch_dockerfile_with_sdk``: a workflow bundle's prepared environment).
        userns: ``"auto"`` runs the trial in a user namespace of its own (podman's
            ``--userns=auto``), so that its root is not the host's root; it needs ranges for the
            ``containers`` user in ``/etc/subuid`` and ``/etc/subgid``. Off by default: it adds about a
            second to each start of a large image (README, "Isolation").
        protect_tests: keep ``/tests`` from the agent (see the module docstring). Off: the tests
            are copied in at verification as Harbor's docker environment does, writable, and
            a process the agent left behind can rewrite them.
        task_env_passthrough: the host variables a compose file's ``${VAR}`` may read (the
            backend's field of that name; :mod:`.interpolation`).
        verifier_watch_sec: how long the reward files are watched after the verifier's output
            is copied, when processes the agent left are still running (:mod:`.verifier_watch`).
        build_timeout_multiplier: what the task's ``build_timeout_sec`` is multiplied by (the
            backend's environment build timeout multiplier; Harbor's start timeout has it too).
        """
        self._owns_tests = owns_its_tests(kwargs)
        self._compose_variables = ComposeVariables.from_host(task_env_passthrough or ())
        self._images = image_resolver(
            base_images=base_images, extra_ca_certs=extra_ca_certs, pull=pull, max_parallel_builds=max_parallel_builds,
            baked_paths=None if self._owns_tests else baked_paths, pids_limit=pids_limit, build_timeout_multiplier=build_timeout_multiplier,
        )  # fmt: skip
        if pids_limit < 1:
            raise ValueError(f"pids_limit: {pids_limit} must be at least 1.")
        if max_copy_mb < 1:
            raise ValueError(f"max_copy_mb: {max_copy_mb} must be at least 1.")
        self._max_copy_bytes = max_copy_mb * 1024 * 1024
        self._default_memory_mb = default_memory_mb
        self._pids_limit = pids_limit
        self._protect_tests = protect_tests
        self._userns = check_userns(userns)
        self._tests: VerifierTests | None = None  # made by start()
        self._egress: egress.EgressProxy | None = None  # a restricted trial's proxy, between start() and stop()
        self._stop_watching: Callable[[], None] | None = None  # a public trial's connection watch (:mod:`.connections`)
        self._container: str | None = None
        self._pod: pod.Pod | None = None  # a multi-service task's, between start() and stop()
        self._services: dict[str, str] = {}
        self._service_images: dict[str, str] = {}
        self.image: str | None = None
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            **kwargs,
        )
        self._report = TrialReport(trial_paths.trial_dir, session_id)
        self._watch = VerifierWatch(self._report, self.logger, verifier_watch_sec)

    @staticmethod
    @override
    def type() -> str:
        return "prefect-harbor-container"

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        # docker_compose: compose services run in a pod, with Harbor's per-service operations
        # (collect hooks, sidecar artifacts) below; overlays are refused (_validate_extra_docker_compose_support).
        # The network: no-network and allowlist trials have none of their own; their proxy's list
        # changes between phases (:mod:`.egress`), which is the only switch there is.
        allowlist = dict.fromkeys(_ALLOWLIST_CAPABILITIES, True)
        return EnvironmentCapabilities(disable_internet=True, mounted=False, docker_compose=True, dynamic_network_policy=True, **allowlist)

    @override
    def _validate_extra_docker_compose_support(self) -> None:
        if self.extra_docker_compose_paths:
            raise ValueError(
                "extra_docker_compose overlays are not read by the local container sandbox; "
                "put the settings in the task's environment/docker-compose.yaml, or run in Harbor's 'docker' environment."
            )

    @classmethod
    @override
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True)

    @classmethod
    @override
    def preflight(cls) -> None:
        try:
            podman_path()
        except EngineError as error:
            raise SystemExit(str(error)) from None

    @override
    def validate_network_policy_support(self, network_policy: NetworkPolicy | None = None) -> None:
        policy = network_policy or self._network_policy
        if policy.network_mode == NetworkMode.ALLOWLIST and os.geteuid() != 0:
            raise ValueError(
                "network_mode='allowlist' needs the sweep to run as root here: its proxy is put into the trial's own "
                "network namespace by the host's root. Run the sweep as root, or set the task's network_mode to "
                "'public' or 'no-network'."
            )
        super().validate_network_policy_support(network_policy)

    @override
    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        """A phase's policy: a restricted trial's proxy takes the phase's list (the task was refused
        before its trial if a phase would need a network the container does not have)."""
        if self._egress is None or network_policy.network_mode == NetworkMode.PUBLIC:
            raise ValueError(
                f"this trial's network ({self._network_policy.network_mode.value}) cannot become {network_policy.network_mode.value} "
                "while it runs: the local sandbox switches between 'no-network' and 'allowlist' only."
            )
        self._egress.switch(network_policy)

    def _restricted(self) -> bool:
        """Whether the trial gets no network of its own (no-network or allowlist, or a compose
        main with ``network_mode: none``): its only way out is its proxy."""
        return self._network_policy.network_mode != NetworkMode.PUBLIC or self._main.no_network

    def _proxy_variables(self) -> dict[str, str]:
        """The proxy settings main and its services start with: the host's (relayed) on the
        bridge; a restricted trial's own proxy where any of its phases has an allowlist."""
        if not self._restricted():
            return container_proxy_variables()
        if any(policy.network_mode == NetworkMode.ALLOWLIST for policy in [self._network_policy, *self._phase_network_policies]):
            return egress.proxy_variables(self._compose.host_names if self._compose else ())
        return {}

    async def _start_egress(self, container: str) -> None:
        """A restricted trial's proxy, listening in the network namespace of ``container`` before
        anything of the task runs there."""
        if not self._restricted():
            return
        if (root := await ContainerRoot.of(container)) is None:
            raise EngineError(f"container {container} stopped before its network proxy could start")
        pid = root.init_pid
        public = self._network_policy.network_mode == NetworkMode.PUBLIC  # a compose main with network_mode: none
        policy = NetworkPolicy(network_mode=NetworkMode.NO_NETWORK) if public else self._network_policy
        proxy = egress.EgressProxy(policy, self._record_egress, self._flush_egress)
        await asyncio.to_thread(proxy.start, pid)
        self._egress = proxy
        self._report.open("network")

    async def _watch_connections(self, container: str) -> None:
        """On the public network: watch where ``container`` (the trial's network) connects (:mod:`.connections`)."""
        if self._restricted() or not await asyncio.to_thread(connections.observable):
            return
        if (root := await ContainerRoot.of(container)) is None:
            raise EngineError(f"container {container} stopped before its connections could be watched")
        if addresses := list(root.addresses):
            self._report.open("network")
            self._stop_watching = await asyncio.to_thread(connections.watch, addresses, self._record_connection)

    def _record_connection(self, destination: connections.Destination) -> None:
        protocol, address, port = destination
        entry = {"host": address, "port": port, "protocol": protocol, "allowed": True, "why": "", "count": 1, "first": time.time()}
        self._report.put("network", entry, key=f"{protocol}:{address}:{port}")

    def _record_egress(self, attempt: egress.Attempt) -> None:
        self._report.put("network", dataclasses.asdict(attempt), key=attempt.key)

    def _flush_egress(self, attempts: list[egress.Attempt], unrecorded: int) -> None:
        """The proxy's final counts, and how many requests went unlisted past its cap, in one write."""
        entries = {attempt.key: dataclasses.asdict(attempt) for attempt in attempts}
        if unrecorded:
            entries["more"] = {"more": unrecorded, "first": time.time()}
        self._report.put_all("network", entries)

    @override
    def _validate_definition(self) -> None:
        self._compose = check_environment_definition(self.environment_dir, self.task_env_config.docker_image, self._compose_variables, self.logger)

    @property
    def container_id(self) -> str | None:
        """The running main container's id, between ``start()`` and ``stop()``."""
        return self._container

    @property
    def service_containers(self) -> dict[str, str]:
        """The compose services beside main, by name: their container ids, between ``start()`` and ``stop()``."""
        return dict(self._services)

    def _compose_services(self) -> bool:
        return bool(self._compose and self._compose.services)

    @property
    def _main(self) -> Service:
        return self._compose.main if self._compose else Service()

    # ------------------------------------------------------------------ lifecycle

    async def prepare_image(self, force_build: bool = False) -> str:
        """Build (or find) this task's image, and its compose services' images, without starting a container."""
        images = EnvironmentImages(self.environment_dir, self.task_env_config, self._compose, self.environment_name, self._images, self.logger)
        self.image = await images.main(force_build=force_build)
        self._service_images = await images.services()
        return self.image

    @override
    async def start(self, force_build: bool) -> None:
        image = await self.prepare_image(force_build)
        network = "none" if self._restricted() else await asyncio.to_thread(ensure_network)
        janitor.ensure_watchdog()
        name = f"ph-{_sanitize(self.session_id)[:40]}-{secrets.token_hex(3)}"
        if self._tests is None and self._protect_tests and not self._owns_tests:
            self._tests = VerifierTests(self.logger, size_mb=self._effective_memory_mb or self._default_memory_mb)
        with env_file_options({**await asyncio.to_thread(self._proxy_variables), **self._main.environment, **self._startup_env()}) as env_args:
            if self._compose_services():
                await self._start_pod(name, network, image, env_args)
            else:
                await self._start_container(name, network, image, env_args)
        await self._ensure_log_dirs(image)
        await self._watch.baseline(self._require_container())
        await self._upload_environment_dir_after_start()

    async def _start_container(self, name: str, network: str, image: str, env_args: list[str]) -> None:
        """The trial as one container: Harbor's main service alone (and its healthcheck passed)."""
        args = ["run", "--detach", "--name", name, "--network", network, *self._main_options(), *env_args]
        for host in self._main.extra_hosts:
            args += ["--add-host", host]
        try:
            done = await podman(*args, image, *KEEP_ALIVE, timeout=STATE_CALL_TIMEOUT_SEC)
            if restarted := await workdir.start_creating_workdir(name, done):  # its --workdir is not in the image
                restarted.check(f"starting a container from {image}")
                done = await podman("inspect", "--format", "{{.Id}}", name)
        except (asyncio.CancelledError, TimeoutError):
            # The container may exist already: it is named, so it can go before we do.
            await asyncio.shield(podman("rm", "--force", "--ignore", "--time", "0", name, timeout=STATE_CALL_TIMEOUT_SEC))
            raise
        self._container = done.check(f"starting a container from {image}").text
        if network != "none":
            await asyncio.to_thread(isolate_ports)
        await self._start_egress(self._container)
        await self._watch_connections(self._container)
        if self._main.healthcheck:
            await pod.wait_healthy(self._container, MAIN, self._main.healthcheck)

    async def _start_pod(self, name: str, network: str, image: str, env_args: list[str]) -> None:
        """The trial as a pod (:mod:`.pod`): main and its compose services, started as ``compose up --wait`` would."""
        assert self._compose is not None
        labels = {LABEL_OWNER: janitor.owner_token(), LABEL_TRIAL: self.session_id}
        self._pod = pod.Pod(name, labels, network, self._compose.host_names, pids_limit=self._pids_limit, userns=self._userns)
        try:
            await self._pod.create()
            if network != "none":
                await asyncio.to_thread(isolate_ports)  # before any service listens
            await self._start_egress(f"{name}-infra")  # the pod's namespace, before any service starts
            await self._watch_connections(f"{name}-infra")
            await pod.start_in_order(self._compose, functools.partial(self._add_to_pod, self._pod, image, env_args))
        except BaseException:
            await asyncio.shield(self._remove_pod())
            raise

    async def _add_to_pod(self, trial_pod: pod.Pod, image: str, main_env_args: list[str], service: Service) -> str:
        """Start one service's container in the trial's pod (main's with the main image and options); its id."""
        name = f"{trial_pod.name}-{service.name}"
        if service.name == MAIN:
            self._container = await trial_pod.add(name, [*self._main_options(), *main_env_args], image, list(KEEP_ALIVE), service.extra_host_entries)
            return self._container
        with env_file_options({**await asyncio.to_thread(self._proxy_variables), **service.environment}) as env_args:
            options = [*self._service_options(service), *env_args]
            container = await trial_pod.add(name, options, self._service_images[service.name], service.command or [], service.extra_host_entries)
        self._services[service.name] = container
        return container

    def _isolation_options(self, service: str) -> list[str]:
        """What every container of the trial gets: owner labels, the process limit, the seccomp profile."""
        args = [
            "--label", f"{LABEL_OWNER}={janitor.owner_token()}", "--label", f"{LABEL_TRIAL}={self.session_id}",
            "--label", f"{LABEL_SERVICE}={service}", "--pids-limit", str(self._pids_limit),
            # Podman would pass the host's proxy variables as they are, credentials included: the
            # container gets container_proxy_variables() instead.
            "--http-proxy=false",
        ]  # fmt: skip
        if seccomp := seccomp_options():
            args += seccomp
        else:
            self.logger.warning(f"No default seccomp profile at {DEFAULT_SECCOMP_PROFILE}: trials run with podman's built-in one, which allows keyctl and unshare.")
        return args

    def _main_options(self) -> list[str]:
        """The main container's options, less its network: isolation, the task's resources, mounts, ``/tests``."""
        args = ["--init", *self._isolation_options(MAIN)]
        if self._userns and not self._compose_services():
            args += ["--userns", self._userns]  # in a pod, the pod holds the user namespace
        if cpus := self._effective_cpus:
            args += ["--cpus", str(cpus)]
        if memory_mb := self._effective_memory_mb or self._default_memory_mb:
            args += ["--memory", f"{memory_mb}m"]
        if workdir := self.task_env_config.workdir or self._main.working_dir:
            args += ["--workdir", workdir]
        args += self._main.run_args()
        for mount in self._host_mounts:
            args += ["--volume", _volume(mount)]
        if self._tests is not None:
            args += ["--volume", f"{self._tests.floor}:{TESTS_DIR}:ro"]
        return args

    def _service_options(self, service: Service) -> list[str]:
        """A compose service's options: the same isolation as main, no host mounts, and the
        default memory cap (the task's own resources are main's, as in Harbor)."""
        args = [*self._isolation_options(service.name), "--memory", f"{self._default_memory_mb}m", *service.run_args()]
        if service.working_dir:
            args += ["--workdir", service.working_dir]
        return args

    async def _ensure_log_dirs(self, image: str) -> None:
        """Harbor's writable mount targets, if any; this first exec doubles as the readiness check.

        The container's ENTRYPOINT must hand over to the keep-alive command, as under Docker.
        """
        targets = self._mount_targets(writable_only=True)
        command = self._ensure_dirs_command(targets) if targets else "true"
        for _ in range(50):
            result = await self.exec(command, user="root")
            if result.return_code == 0:
                return
            state = await podman("inspect", "--format", "{{.State.Status}}", self._require_container())
            if state.text not in ("running", "created", "configured"):
                logs = await podman("logs", "--tail", "30", self._require_container())
                raise RuntimeError(
                    f"the container from {image} exited before it could run commands ({state.text}); "
                    f"its ENTRYPOINT must end by running its arguments (exec \"$@\"). Output:\n"
                    + (logs.stdout + logs.stderr).decode(errors="replace")[-2000:]
                )
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the container from {image} did not accept commands within 5 s: {result.stderr[-500:] if result.stderr else ''}")

    @override
    async def stop(self, delete: bool) -> None:
        """Remove the container (or the pod, with every service in it); images stay cached whatever ``delete`` says."""
        container, self._container = self._container, None
        self._watch.close()
        if self._egress is not None:
            egress_proxy, self._egress = self._egress, None
            await asyncio.to_thread(egress_proxy.close)  # sockets ended and the report written off the event loop
        if self._stop_watching is not None:
            stop_watching, self._stop_watching = self._stop_watching, None
            await asyncio.to_thread(stop_watching)  # a last read, while the container still holds its address
        if self._tests is not None:
            await self._tests.close()
            self._tests = None
        if self._pod is not None:
            await asyncio.shield(self._remove_pod())
        elif container:
            removed = await asyncio.shield(remove_container(container))
            if removed is not None:
                self.logger.warning(f"Removing container {container} failed: {removed}")

    async def _remove_pod(self) -> None:
        trial_pod, self._pod = self._pod, None
        self._container = None
        self._services.clear()
        if trial_pod is None:
            return
        removed = await trial_pod.remove()
        if removed.returncode != 0:
            self.logger.warning(f"Removing pod {trial_pod.name} failed: {removed.stderr.decode(errors='replace').strip()}")

    # ------------------------------------------------------------------ commands

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        shell = ["bash", "-c", command]
        return await self._exec_in(self._require_container(), shell, cwd or self.task_env_config.workdir, self._merge_env(env) or {}, timeout_sec, self._resolve_user(user))

    async def _exec_in(
        self, container: str, argv: list[str], workdir: str | None, variables: dict[str, str], timeout_sec: int | None, user: str | int | None
    ) -> ExecResult:
        """``argv`` in one of the trial's containers (:mod:`.container_exec`); main's execs are timed while a verification is watched."""
        watch = self._watch if container == self._container else None
        return await exec_in(
            container, argv, workdir=workdir, variables=variables, timeout_sec=timeout_sec, user=user,
            output=self._output_callback(), watch=watch, running=self._runs,
        )  # fmt: skip

    def _runs(self, container: str) -> bool:
        """Whether ``container`` is still one of this trial's (``stop()`` has not removed it)."""
        return container in (self._container, *self._services.values())

    def _require_container(self) -> str:
        if not self._container:
            raise RuntimeError(f"{self.session_id}: the container is not running (start() first).")
        return self._container

    @override
    def _compose_service_transport(self, service: str | None) -> ComposeServiceTransport:
        """The pod's other services (the main container too, for ``stop_service``), reached by podman."""
        return _PodServices(self)

    def _service_container(self, service: str | None) -> str:
        if service not in self._services:
            running = ", ".join(self._services) or "none"
            raise RuntimeError(f"{self.session_id}: no compose service {service!r} is running (running beside main: {running}).")
        return self._services[service]

    # ------------------------------------------------------------------ files

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._put(Path(source_path), PurePosixPath(target_path))

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._put(Path(source_dir), PurePosixPath(target_dir))

    async def _put(self, source: Path, target: PurePosixPath) -> None:
        container = self._require_container()
        if target.is_relative_to(TESTS_DIR):  # Harbor's verifier: its clean-up is done, test.sh comes next
            await self._watch.before_tests(container)
        if self._tests is not None and target.is_relative_to(TESTS_DIR):
            await self._tests.publish(container, source, target, TESTS_DIR)
            return
        await transfer.copy_in(container, source, target)

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._download_file_from(self._require_container(), source_path, Path(target_path))

    async def _download_file_from(self, container: str, source_path: str, target: Path) -> None:
        async with _still_for(container, source_path):
            await transfer.copy_file_out(container, source_path, target, max_bytes=self._max_copy_bytes, on_cut=self._record_cut_copy)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        if PurePosixPath(source_dir) == VERIFIER_DIR:  # Harbor's verifier: test.sh has exited
            return await self._watch.around_copy(functools.partial(self._get, source_dir, Path(target_dir), strip=1))
        await self._get(source_dir, Path(target_dir), strip=1)

    async def _get(self, source: str, target: Path, *, strip: int, container: str | None = None) -> None:
        """``source`` out of the container into ``target`` (:func:`~.transfer.copy_out`), at most ``max_copy_mb``;
        what the limit dropped is counted, in the trial's log and its sandbox report (``copies_cut``)."""
        container = container or self._require_container()
        async with _still_for(container, source):
            await transfer.copy_out(container, source, target, strip=strip, max_bytes=self._max_copy_bytes, on_cut=self._record_cut_copy)

    def _record_cut_copy(self, source: str, done: transfer.Unpacked) -> None:
        at_least = "at least " if done.stopped_early else ""
        self.logger.warning(
            f"Copying {source} out of the container stopped at the {self._max_copy_bytes // (1024 * 1024)} MiB limit (max_copy_mb): "
            f"kept {done.written} files and folders ({done.bytes} bytes), dropped {at_least}{done.dropped_files} files ({at_least}{done.dropped_bytes} bytes)."
        )
        entry = {
            "source": source, "limit_bytes": self._max_copy_bytes, "kept_entries": done.written, "kept_bytes": done.bytes,
            "dropped_files": done.dropped_files, "dropped_bytes": done.dropped_bytes, "counted_to_the_end": not done.stopped_early,
        }  # fmt: skip
        with contextlib.suppress(OSError):
            self._report.add("copies_cut", entry)


def _still_for(container: str, source: str) -> contextlib.AbstractAsyncContextManager[None]:
    """Harbor's ``/logs`` (host mounts under Docker) are copied from a paused container (:func:`.transfer.held_still`);
    other paths as ``docker cp`` copies them, from a running one."""
    return transfer.held_still(container) if PurePosixPath(source).is_relative_to(LOGS_DIR) else contextlib.nullcontext()


class _PodServices:
    """Harbor's per-service operations (:class:`ComposeServiceTransport`) on a trial's compose
    services beside main: collect hooks and sidecar artifacts reach the service's own container."""

    def __init__(self, environment: ContainerEnvironment):
        self._environment = environment

    async def service_exec(
        self, command: str, *, service: str, cwd: str | None = None, env: dict[str, str] | None = None, timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:  # fmt: skip
        """``sh -c``, since a service's image may have no bash, and none of main's working folder, user or environment, as in Harbor."""
        container = self._environment._service_container(service)
        return await self._environment._exec_in(container, ["sh", "-c", command], cwd, env or {}, timeout_sec, user)

    async def service_download_file(self, source_path: str, target_path: Path | str, *, service: str) -> None:
        await self._environment._download_file_from(self._environment._service_container(service), source_path, Path(target_path))

    async def service_download_dir(self, source_dir: str, target_dir: Path | str, *, service: str) -> None:
        await self._environment._get(source_dir, Path(target_dir), strip=1, container=self._environment._service_container(service))

    async def stop_service(self, service: str) -> None:
        """Stop one service, the rest of the pod running on: Harbor stops main before it collects
        sidecar evidence, so processes the agent left cannot tamper with it."""
        environment = self._environment
        container = environment._require_container() if environment.is_main_service(service) else environment._service_container(service)
        (await podman("stop", "--time", "0", container, timeout=STATE_CALL_TIMEOUT_SEC)).check(f"stopping service {service!r}")


def check_userns(userns: str | None) -> str | None:
    """``userns`` if this host can honour it: ``"auto"`` needs subordinate ids for the ``containers`` user."""
    if userns in (None, ""):
        return None
    if userns != "auto":
        raise ValueError(f"userns: {userns!r} is not supported; give 'auto' (a user namespace per trial) or leave it empty.")
    for table in ("/etc/subuid", "/etc/subgid"):
        try:
            listed = Path(table).read_text()
        except OSError:
            listed = ""
        if not any(line.split(":", 1)[0] == "containers" for line in listed.splitlines()):
            raise ValueError(
                f"userns: 'auto' needs a range of ids for the 'containers' user in {table}; add one "
                f"(echo containers:2147483647:2147483648 >> {table}) or leave userns empty."
            )
    return userns


def _volume(mount: dict) -> str:
    if mount.get("type", "bind") != "bind":
        raise ValueError(f"mount {mount!r}: only bind mounts are supported by the local container sandbox.")
    options = "ro" if mount.get("read_only") else "rw"
    return f"{mount['source']}:{mount['target']}:{options}"


def _sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in name.lower()).strip("-.") or "trial"
