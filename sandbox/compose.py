"""A task's ``docker-compose.yaml``: its ``main`` service merged into the trial's container, and
any other services run beside it.

Harbor's docker environment merges the task's compose file over its own base ``main``
service (the environment's Dockerfile, Harbor's keep-alive command) and starts the project
with ``docker compose up --wait``: every service from its own build context or image, in
``depends_on`` order, and start-up is over once each service with a healthcheck is healthy.
``main`` and its tests reach the other services by their service names. This module reads
the file the same way, into a :class:`Project` the local sandbox can start
(:mod:`.pod` runs the services; :mod:`.container` the main container):

* ``main``'s keys become options of the trial's container. Harbor's placeholders
  (``${CONTEXT_DIR}``, ``${MAIN_IMAGE_NAME}``, the keep-alive command, ``deploy`` limits
  filled from task.toml, its log volumes) are what this sandbox does already.
* Every other service is built from its own context and Dockerfile inside the environment
  folder, or runs its ``image``; its command, entrypoint, environment, working_dir, user,
  init and healthcheck are honoured, as are ``depends_on`` conditions.
* ``${VAR}`` in values is filled as compose fills it, from the host variables the backend
  passes through and no others (:mod:`.interpolation`); ``$$`` is a literal ``$``.
* Networks: a trial's services share one network namespace, where each reaches every other
  by name, so the implicit ``default`` network, and any ``networks:`` that leave no two
  services apart (plain bridge networks, every two services sharing one), are honoured, with
  ``aliases`` as more names for the service (:mod:`.networks`).
* A host path mounted into a service (``${HOME}/.config/gcloud:/root/.config/gcloud:ro``, for
  optional credentials) becomes an empty folder at its target, with a WARNING naming the service
  and the path: the task runs, and the host's files never reach it. A ``tmpfs`` is honoured.
* Anything else is refused before the trial starts, naming the key: named volumes, extra
  privileges, networks that keep services apart or that this sandbox cannot make
  (``external``, ``internal``, drivers and their options, fixed addresses), build contexts
  outside the environment folder. A task is someone else's data, and the agent is hostile.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from prefect_harbor.sandbox.interpolation import ComposeVariables, Interpolation, InterpolationError
from prefect_harbor.sandbox.networks import NetworkNotHonoured, check_networks, service_networks

COMPOSE_FILE = "docker-compose.yaml"
#: Where Harbor's verifier uploads a task's tests.
TESTS_DIR = PurePosixPath("/tests")
#: The service Harbor runs the agent and the tests in.
MAIN = "main"
#: Folders the sandbox fills and copies out itself: no compose mount may cover them.
_SANDBOX_FOLDERS = (str(TESTS_DIR), "/logs")
#: Harbor's placeholders for what the environment itself decides.
_HARBOR_BUILD_CONTEXTS = {".", "${CONTEXT_DIR}"}
_HARBOR_IMAGE = "${MAIN_IMAGE_NAME}"
_KEEP_ALIVE = (["sh", "-c", "sleep infinity"], "sh -c 'sleep infinity'", "sleep infinity")
#: Keys with no effect here: names, publishing to the host's ports, restarts, logging, pulls.
_IGNORED = {
    "container_name", "ports", "expose", "restart", "stdin_open", "tty", "labels", "platform",
    "pull_policy", "stop_grace_period", "stop_signal", "logging",
}  # fmt: skip
_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
#: Compose's own rule for service names; they also become host names and container names.
_SERVICE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class ComposeNotSupported(ValueError):
    """The compose file asks for something the local container sandbox cannot honour."""


@dataclass(frozen=True)
class Healthcheck:
    """A compose healthcheck: the command (as argv) and Docker's timing for it."""

    test: tuple[str, ...]
    interval_sec: float = 30.0
    timeout_sec: float = 30.0
    retries: int = 3
    start_period_sec: float = 0.0

    @property
    def poll_sec(self) -> float:
        """How often to run the check: at least every second, since Docker's first check
        waits a whole interval and ours need not, so a ready service is found ready sooner."""
        return min(self.interval_sec, 1.0)

    @property
    def deadline_sec(self) -> float:
        """How long Docker would take to call the service unhealthy: its start period, the
        first interval, then ``retries`` failed ones."""
        return self.start_period_sec + (self.retries + 1) * self.interval_sec


@dataclass(frozen=True)
class Build:
    """A service's build: a context folder and its Dockerfile, both inside the environment folder."""

    context: Path
    dockerfile: Path


@dataclass
class Service:
    """One compose service as the local sandbox runs it."""

    name: str = MAIN
    image: str | None = None  # main: a prebuilt image instead of the environment's Dockerfile
    build: Build | None = None  # services beside main only: main's build is the environment's own
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    environment: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    user: str | None = None
    init: bool = False
    extra_hosts: list[str] = field(default_factory=list)
    shm_size: str | None = None
    no_network: bool = False
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, str] = field(default_factory=dict)  # service -> condition
    #: network -> its ``aliases`` (more names for this service); compose's implicit ``default`` without ``networks:``
    networks: dict[str, list[str]] = field(default_factory=lambda: {"default": []})
    #: Empty folders (a tmpfs each) in place of host paths the compose file mounts: (target, read-only).
    empty_folders: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def extra_host_entries(self) -> list[tuple[str, str]]:
        """``extra_hosts`` as (name, address) pairs."""
        return [tuple(entry.split(":", 1)) for entry in self.extra_hosts]  # type: ignore[misc]

    def run_args(self) -> list[str]:
        """Its options of ``podman run``/``create``, less network, hosts and working folder (the caller's)."""
        args: list[str] = []
        if self.shm_size:
            args += ["--shm-size", self.shm_size]
        if self.entrypoint is not None:
            args += ["--entrypoint", _json_list(self.entrypoint)]
        if self.user:
            args += ["--user", self.user]
        if self.init:
            args.append("--init")
        for target, read_only in self.empty_folders:
            args += ["--tmpfs", f"{target}:{'ro' if read_only else 'rw'},exec,mode=0755"]
        return args


@dataclass
class Project:
    """A task's compose project: ``main`` and the services beside it, in start order."""

    main: Service
    services: dict[str, Service] = field(default_factory=dict)
    start_order: list[Service] = field(default_factory=list)
    #: What the sandbox gave no value, once per variable (e.g. an unset ``${VAR}``): the caller logs them as WARNINGs.
    warnings: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Every service's name."""
        return [MAIN, *self.services]

    @property
    def host_names(self) -> list[str]:
        """Every service's name and network alias: each resolves, in every container of the trial, to the pod's loopback."""
        aliases = (alias for name in self.names for names in self.service(name).networks.values() for alias in names)
        return list(dict.fromkeys([*self.names, *aliases]))

    def service(self, name: str) -> Service:
        return self.main if name == MAIN else self.services[name]


@dataclass(frozen=True)
class _Context:
    """Where a service is defined, for messages and relative paths."""

    where: str  # "<file>: services.<name>"
    environment_dir: Path
    #: Where a service's handlers say what they honour only in part (the project's WARNINGs).
    warnings: list[str] = field(default_factory=list)

    def at(self, key: str) -> str:
        return f"{self.where}.{key}"


def load(environment_dir: Path, tests_dir: str = str(TESTS_DIR), variables: ComposeVariables | None = None) -> Project | None:
    """The task's compose project (None without a compose file), its ``${VAR}`` filled from
    ``variables`` (none by default); :class:`ComposeNotSupported` names the first thing that
    cannot be honoured."""
    path = environment_dir / COMPOSE_FILE
    if not path.is_file():
        return None
    interpolation = Interpolation(variables or ComposeVariables(), tests_dir)
    try:
        document = interpolation.document(_document(path), "")
    except InterpolationError as error:
        raise ComposeNotSupported(f"{path}: {error}") from None
    specs = {name: spec or {} for name, spec in (document.get("services") or {}).items()}
    # Compose starts services with profiles only when asked to; `harbor` never asks.
    specs = {name: spec for name, spec in specs.items() if not (isinstance(spec, dict) and spec.get("profiles"))}
    for name, spec in specs.items():
        if not isinstance(name, str) or not _SERVICE_NAME.fullmatch(name) or not isinstance(spec, dict):
            raise ComposeNotSupported(f"{path}: services.{name}: a service needs a name of letters, digits, '_', '.', '-' and a mapping of settings.")
    warnings = [f"{path}: {warning}" for warning in interpolation.warnings.values()]
    main = _service(MAIN, specs.pop(MAIN, {}), _Context(f"{path}: services.{MAIN}", environment_dir, warnings), _MAIN_KEYS)
    services = {name: _side_service(name, spec, _Context(f"{path}: services.{name}", environment_dir, warnings)) for name, spec in specs.items()}
    project = Project(main, services, warnings=warnings)
    try:
        check_networks({name: project.service(name).networks for name in project.names}, document.get("networks"), str(path))
    except NetworkNotHonoured as error:
        raise ComposeNotSupported(str(error)) from None
    if services and main.no_network:
        raise ComposeNotSupported(
            f"{path}: services.main.network_mode: 'none' would cut main off from its services; "
            "set task.toml's [environment] network_mode = 'no-network' instead (the services stay reachable, the outside does not)."
        )
    project.start_order = _start_order(project, str(path))
    return project


def _document(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ComposeNotSupported(f"{path}: not valid YAML ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("services") or {}, dict):
        raise ComposeNotSupported(f"{path}: a compose file is a mapping with a 'services' mapping.")
    extra = sorted(key for key in set(document) - {"services", "version", "name", "networks"} if not str(key).startswith("x-"))
    if extra:
        raise ComposeNotSupported(
            f"{path}: top-level {', '.join(extra)} cannot be honoured by the local container sandbox "
            "(a trial's services share no volumes, configs or secrets); copy what they need in their Dockerfiles."
        )
    return document


Handler = Callable[[Service, Any, _Context], None]


def _service(name: str, spec: dict[str, Any], context: _Context, handlers: dict[str, Handler]) -> Service:
    service = Service(name=name)
    for key, value in spec.items():
        if key in _IGNORED or str(key).startswith("x-"):  # x-*: compose's extension fields, ignored by compose too
            continue
        handler = handlers.get(key)
        if handler is None:
            raise ComposeNotSupported(f"{context.at(str(key))} cannot be honoured by the local container sandbox; run this task in Harbor's 'docker' environment.")
        handler(service, value, context)
    return service


def _side_service(name: str, spec: dict[str, Any], context: _Context) -> Service:
    service = _service(name, spec, context, _SIDE_KEYS)
    if service.build is None and service.image is None:
        raise ComposeNotSupported(f"{context.where}: a service beside main needs a build or an image.")
    return service


def _start_order(project: Project, where: str) -> list[Service]:
    """Services in an order that starts each after what it depends on; unknown or circular dependencies are refused."""
    graph: dict[str, set[str]] = {}
    for name in project.names:
        service = project.service(name)
        for dependency, condition in service.depends_on.items():
            if dependency not in project.names:
                raise ComposeNotSupported(f"{where}: services.{name}.depends_on: {dependency!r} is not a service of this file.")
            if condition == "service_healthy" and project.service(dependency).healthcheck is None:
                raise ComposeNotSupported(f"{where}: services.{name}.depends_on.{dependency}: service_healthy, but {dependency!r} has no healthcheck.")
        graph[name] = set(service.depends_on)
    try:
        return [project.service(name) for name in TopologicalSorter(graph).static_order()]
    except CycleError as error:
        raise ComposeNotSupported(f"{where}: depends_on goes round in a circle ({' -> '.join(error.args[1])}).") from None


# ---------------------------------------------------------------------- keys of every service


def _set_environment(service: Service, value: Any, context: _Context) -> None:
    where = context.at("environment")
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list):
        pairs = [(name, text) for name, _, text in (str(item).partition("=") for item in value)]
    else:
        raise ComposeNotSupported(f"{where}: give a mapping or a list of NAME=value.")
    service.environment = {str(key): "" if item is None else _literal(item, f"{where}.{key}") for key, item in pairs}


def _set_working_dir(service: Service, value: Any, context: _Context) -> None:
    service.working_dir = _literal(value, context.at("working_dir"))


def _set_entrypoint(service: Service, value: Any, context: _Context) -> None:
    service.entrypoint = _argv(value, context.at("entrypoint"))


def _set_extra_hosts(service: Service, value: Any, context: _Context) -> None:
    entries = value.items() if isinstance(value, dict) else (re.split(r"[=:]", str(host), maxsplit=1) for host in value or [])
    hosts = []
    for entry in entries:
        if len(entry) != 2:
            raise ComposeNotSupported(f"{context.at('extra_hosts')}: {entry!r}; give host:address or host=address.")
        hosts.append(f"{entry[0]}:{entry[1]}")
    service.extra_hosts = hosts


def _set_shm_size(service: Service, value: Any, context: _Context) -> None:
    service.shm_size = str(value)


def _set_healthcheck(service: Service, value: Any, context: _Context) -> None:
    service.healthcheck = _healthcheck(value or {}, context.at("healthcheck"))


def _set_networks(service: Service, value: Any, context: _Context) -> None:
    try:
        service.networks = service_networks(value, context.at("networks"))
    except NetworkNotHonoured as error:
        raise ComposeNotSupported(str(error)) from None


def _set_depends_on(service: Service, value: Any, context: _Context) -> None:
    where = context.at("depends_on")
    if isinstance(value, list):
        service.depends_on = {str(name): "service_started" for name in value}
        return
    if not isinstance(value, dict):
        raise ComposeNotSupported(f"{where}: give a list of services or a mapping of service to condition.")
    depends_on = {}
    for name, spec in value.items():
        spec = spec or {}
        other = sorted(set(spec) - {"condition", "restart", "required"})
        condition = spec.get("condition", "service_started")
        if other or condition not in _CONDITIONS:
            raise ComposeNotSupported(f"{where}.{name}: only a condition of {', '.join(sorted(_CONDITIONS))} is honoured here.")
        depends_on[str(name)] = condition
    service.depends_on = depends_on


# ---------------------------------------------------------------------- keys of main


def _main_build(service: Service, value: Any, context: _Context) -> None:
    spec = {"context": value} if isinstance(value, str) else dict(value or {})
    if spec.get("context", ".") not in _HARBOR_BUILD_CONTEXTS or spec.get("dockerfile", "Dockerfile") != "Dockerfile" or set(spec) - {"context", "dockerfile"}:
        raise ComposeNotSupported(f"{context.at('build')}: main is built from the environment folder's own Dockerfile here (context '.', dockerfile 'Dockerfile').")


def _main_image(service: Service, value: Any, context: _Context) -> None:
    service.image = None if value == _HARBOR_IMAGE else _literal(value, context.at("image"))


def _main_command(service: Service, value: Any, context: _Context) -> None:
    if value not in _KEEP_ALIVE:
        raise ComposeNotSupported(f"{context.at('command')}: the main container runs Harbor's keep-alive command; put setup in the ENTRYPOINT (it runs first).")


def _main_network_mode(service: Service, value: Any, context: _Context) -> None:
    if value != "none":
        raise ComposeNotSupported(f"{context.at('network_mode')}: {value!r}; use task.toml's network_mode, or 'none'.")
    service.no_network = True


def _main_deploy(service: Service, value: Any, context: _Context) -> None:
    limits = ((value or {}).get("resources") or {}).get("limits") or {}
    if set(value or {}) - {"resources"} or set(limits) - {"cpus", "memory"} or any(str(v) not in ("${CPUS}", "${MEMORY}") for v in limits.values()):
        raise ComposeNotSupported(f"{context.at('deploy')}: set cpus and memory_mb in task.toml's [environment]; they are enforced from there.")


def _set_volumes(service: Service, value: Any, context: _Context) -> None:
    """Host paths become empty folders (with a WARNING), tmpfs mounts are honoured, Harbor's log volumes are its own."""
    if not isinstance(value, list):
        raise ComposeNotSupported(f"{context.at('volumes')}: a list of volumes.")
    for index, volume in enumerate(value):
        if _is_harbor_log_volume(volume):
            continue
        where = f"{context.at('volumes')}[{index}]"
        kind, source, target, read_only = _volume(volume, where)
        if target == "/" or any(PurePosixPath(target).is_relative_to(kept) for kept in _SANDBOX_FOLDERS) or not target.startswith("/"):
            raise ComposeNotSupported(
                f"{where}: target {target!r} cannot be a mount here: it must be an absolute folder, not / nor under {' or '.join(_SANDBOX_FOLDERS)} "
                "(the tests and Harbor's logs, which the sandbox places and copies out itself)."
            )
        if ".." in PurePosixPath(target).parts or any(c in target for c in ",:") or not target.isprintable():
            raise ComposeNotSupported(
                f"{where}: target {target!r} cannot be a mount here: a plain absolute path is needed, without '..', ',' or ':' "
                "(the engine would read what follows them as the mount's options, or another folder)."
            )
        if kind == "bind":
            context.warnings.append(
                f"{where}: the host path {source!r} is not mounted (a host's files never reach a trial): {target} is an empty folder instead, "
                "so the task runs as it would where that path does not exist; copy what it must hold in the Dockerfile."
            )
        elif kind != "tmpfs":
            raise ComposeNotSupported(
                f"{where}: {_described(kind, source)} cannot be honoured by the local container sandbox (a trial's services share "
                "no volumes); copy what it holds in the Dockerfile, or run this task in Harbor's 'docker' environment."
            )
        service.empty_folders.append((target, read_only))


def _described(kind: str, source: str) -> str:
    if kind == "volume":
        return f"the named volume {source!r}" if source else "an anonymous volume"
    return f"a {kind} mount" + (f" of {source!r}" if source else "")


def _volume(volume: Any, where: str) -> tuple[str, str, str, bool]:
    """``(kind, source, target, read_only)`` of a volume in compose's short (``SRC:TARGET[:MODE]``) or long syntax."""
    if isinstance(volume, dict):
        kind, source, target = str(volume.get("type", "volume")), str(volume.get("source") or ""), str(volume.get("target") or "")
        return kind, source, target, bool(volume.get("read_only"))
    if not isinstance(volume, str) or not volume:
        raise ComposeNotSupported(f"{where}: a volume is 'SOURCE:TARGET[:MODE]' or a mapping with type, source and target.")
    parts = volume.split(":")
    if len(parts) == 1:
        return "volume", "", parts[0], False  # anonymous: compose fills it from the image
    source, target, mode = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
    kind = "bind" if source.startswith(("/", ".", "~")) or not source else "volume"
    return kind, source, target, "ro" in mode.split(",")


# ---------------------------------------------------------------------- keys of the services beside main


def _side_build(service: Service, value: Any, context: _Context) -> None:
    where = context.at("build")
    spec = {"context": value} if isinstance(value, str) else dict(value or {})
    other = sorted(set(spec) - {"context", "dockerfile"})
    if other:
        raise ComposeNotSupported(f"{where}.{other[0]} cannot be honoured here; a service is built from its context and Dockerfile alone.")
    folder = _inside(context.environment_dir, str(spec.get("context", ".")).replace("${CONTEXT_DIR}", "."), f"{where}.context")
    dockerfile = _inside(context.environment_dir, str(folder / str(spec.get("dockerfile", "Dockerfile"))), f"{where}.dockerfile")
    if not folder.is_dir() or not dockerfile.is_file():
        raise ComposeNotSupported(f"{where}: {dockerfile} does not exist; a service's build needs its context folder and Dockerfile in the task.")
    service.build = Build(folder, dockerfile)


def _side_image(service: Service, value: Any, context: _Context) -> None:
    if value != _HARBOR_IMAGE:
        service.image = _literal(value, context.at("image"))
        return
    # Harbor's name for main's image, which is built from the environment's Dockerfile: the same
    # build (the same content, so the same cached image), unless the service has a build of its own.
    dockerfile = context.environment_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise ComposeNotSupported(f"{context.at('image')}: {_HARBOR_IMAGE} is main's image, built from the environment's Dockerfile, and there is none; give the "
            f"service an image or a build.")
    service.build = service.build or Build(context.environment_dir.resolve(), dockerfile.resolve())


def _side_command(service: Service, value: Any, context: _Context) -> None:
    service.command = _argv(value, context.at("command"))


def _side_user(service: Service, value: Any, context: _Context) -> None:
    service.user = _literal(value, context.at("user"))


def _side_init(service: Service, value: Any, context: _Context) -> None:
    service.init = bool(value)


_COMMON_KEYS: dict[str, Handler] = {
    "environment": _set_environment, "working_dir": _set_working_dir, "entrypoint": _set_entrypoint,
    "extra_hosts": _set_extra_hosts, "shm_size": _set_shm_size, "healthcheck": _set_healthcheck,
    "depends_on": _set_depends_on, "networks": _set_networks,
}  # fmt: skip
_MAIN_KEYS: dict[str, Handler] = {
    **_COMMON_KEYS, "build": _main_build, "image": _main_image, "command": _main_command,
    "network_mode": _main_network_mode, "deploy": _main_deploy, "volumes": _set_volumes,
}  # fmt: skip
_SIDE_KEYS: dict[str, Handler] = {
    **_COMMON_KEYS, "build": _side_build, "image": _side_image, "command": _side_command, "user": _side_user, "init": _side_init,
    "volumes": _set_volumes,
}  # fmt: skip


# ---------------------------------------------------------------------- values


def _literal(value: Any, where: str) -> str:
    """A compose value as a string (already interpolated by :func:`load`: no ``$$`` left to unescape)."""
    if isinstance(value, dict | list):
        raise ComposeNotSupported(f"{where}: give a string, not {type(value).__name__}.")
    return str(value)


def _argv(value: Any, where: str) -> list[str]:
    """A command or entrypoint as argv: compose splits a string the way a shell would, without running one."""
    if isinstance(value, str):
        return [_literal(part, where) for part in shlex.split(value)]
    if isinstance(value, list):
        return [_literal(part, where) for part in value]
    raise ComposeNotSupported(f"{where}: give a string or a list of strings.")


def _healthcheck(value: dict[str, Any], where: str) -> Healthcheck | None:
    """The check as argv (compose's string, CMD-SHELL or CMD forms) with its timing; None when disabled."""
    test = value.get("test")
    if value.get("disable") or test is None or test == ["NONE"]:
        return None
    if isinstance(test, str):
        argv = ("/bin/sh", "-c", _literal(test, f"{where}.test"))
    elif isinstance(test, list) and test and test[0] == "CMD-SHELL":
        argv = ("/bin/sh", "-c", _literal(" ".join(map(str, test[1:])), f"{where}.test"))
    elif isinstance(test, list) and test and test[0] == "CMD":
        argv = tuple(_literal(part, f"{where}.test") for part in test[1:])  # type: ignore[assignment]  # CMD: any length
    else:
        raise ComposeNotSupported(f"{where}.test: {test!r} is not a string, [\"CMD\", ...] or [\"CMD-SHELL\", ...].")
    other = sorted(set(value) - {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"})
    if other:
        raise ComposeNotSupported(f"{where}.{other[0]} is not a healthcheck setting.")
    return Healthcheck(
        test=argv,
        interval_sec=_duration(value.get("interval", "30s"), f"{where}.interval"),
        timeout_sec=_duration(value.get("timeout", "30s"), f"{where}.timeout"),
        retries=int(value.get("retries", 3)),
        start_period_sec=_duration(value.get("start_period", "0s"), f"{where}.start_period"),
    )


def _duration(value: Any, where: str) -> float:
    """Compose's durations: ``1m30s``, ``500ms``, ``10s`` (or a number of seconds)."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ComposeNotSupported(f"{where}: {value!r} is not a duration like 10s, 1m30s or 500ms.")
    return sum(float(number) * _SECONDS[unit] for number, unit in parts)


def _inside(root: Path, relative: str, where: str) -> Path:
    """``relative`` under ``root``, refused when it leads out of it: a build context outside the
    task would put host files into an image the agent can read."""
    resolved = (root / relative).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ComposeNotSupported(f"{where}: {relative!r} is outside the task's environment folder; keep service build contexts inside it.")
    return resolved


def _is_harbor_log_volume(volume: Any) -> bool:
    """Harbor's own log mounts (``${HOST_..._PATH}:${ENV_..._PATH}``): copied out instead here."""
    return isinstance(volume, str) and volume.startswith("${") and "LOGS" in volume.upper()


def _json_list(parts: list[str]) -> str:
    """podman's --entrypoint takes a JSON array for a command with arguments."""
    return json.dumps(parts)
