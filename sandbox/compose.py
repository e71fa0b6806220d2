"""A task's single-service ``docker-compose.yaml``, merged into its one container's settings.

``harbor tasks migrate`` writes a compose file with one ``main`` service for every
Terminal-Bench task with a non-default compose setting, and Harbor's docker environment
merges it over its own base service. This module does the same for the local sandbox: the
keys one podman container can honour become its run options; Harbor's own placeholders
(``${CONTEXT_DIR}``, ``${MAIN_IMAGE_NAME}``, the keep-alive command, ``deploy`` limits
filled from task.toml) are what this sandbox does already; anything else is refused before
the trial starts, naming the key. Several services (databases, web servers beside the main
container) are not run here yet: they are refused too.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

COMPOSE_FILE = "docker-compose.yaml"
#: Harbor's placeholders for what the environment itself decides.
_HARBOR_BUILD_CONTEXTS = {".", "${CONTEXT_DIR}"}
_HARBOR_IMAGE = "${MAIN_IMAGE_NAME}"
_KEEP_ALIVE = (["sh", "-c", "sleep infinity"], "sh -c 'sleep infinity'", "sleep infinity")
#: Keys with no effect on one local container (names, publishing to the host's ports, restarts).
_IGNORED = {"container_name", "ports", "expose", "restart", "stdin_open", "tty", "labels", "platform"}


class ComposeNotSupported(ValueError):
    """The compose file asks for something the local container sandbox cannot honour."""


@dataclass
class ServiceSettings:
    """What the main service adds to ``podman run``."""

    environment: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    entrypoint: list[str] | None = None
    extra_hosts: list[str] = field(default_factory=list)
    no_network: bool = False
    shm_size: str | None = None
    healthcheck: str | None = None  # a shell command that must succeed before the agent starts
    image: str | None = None  # a prebuilt image instead of the environment's Dockerfile

    def run_args(self) -> list[str]:
        args: list[str] = []
        for host in self.extra_hosts:
            args += ["--add-host", host]
        if self.shm_size:
            args += ["--shm-size", self.shm_size]
        if self.entrypoint is not None:
            args += ["--entrypoint", _json_list(self.entrypoint)]
        return args


def main_service(environment_dir: Path, tests_dir: str = "/tests") -> ServiceSettings | None:
    """The compose file's settings (None without one); :class:`ComposeNotSupported` names what cannot be honoured."""
    path = environment_dir / COMPOSE_FILE
    if not path.is_file():
        return None
    where = f"{path}"
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ComposeNotSupported(f"{where}: not valid YAML ({error})") from None
    extra = sorted(set(document) - {"services", "version", "name"})
    if extra:
        raise ComposeNotSupported(f"{where}: top-level {', '.join(extra)} cannot be honoured by the local container sandbox (one container per trial).")
    services = document.get("services") or {}
    if len(services) != 1:
        raise ComposeNotSupported(
            f"{where}: {len(services)} services ({', '.join(services)}); the local container sandbox runs one service per trial so far: "
            "run this task in Harbor's 'docker' environment."
        )
    ((name, service),) = services.items()
    return _settings(service or {}, f"{where}: services.{name}", tests_dir)


def _settings(service: dict[str, Any], where: str, tests_dir: str) -> ServiceSettings:
    settings = ServiceSettings()
    for key, value in service.items():
        if key in _IGNORED:
            continue
        if key == "build":
            context = value if isinstance(value, str) else (value or {}).get("context", ".")
            dockerfile = "Dockerfile" if isinstance(value, str) else (value or {}).get("dockerfile", "Dockerfile")
            other = sorted(set(value) - {"context", "dockerfile"}) if isinstance(value, dict) else []
            if context not in _HARBOR_BUILD_CONTEXTS or dockerfile != "Dockerfile" or other:
                raise ComposeNotSupported(f"{where}.build: only the environment folder's own Dockerfile is built here (context '.', dockerfile 'Dockerfile').")
        elif key == "image":
            settings.image = None if value == _HARBOR_IMAGE else str(value)
        elif key == "command":
            if value not in _KEEP_ALIVE:
                raise ComposeNotSupported(f"{where}.command: the main container runs Harbor's keep-alive command; put setup in the ENTRYPOINT (it runs first).")
        elif key == "entrypoint":
            settings.entrypoint = [_literal(part, f"{where}.entrypoint") for part in (value.split() if isinstance(value, str) else value)]
        elif key == "environment":
            settings.environment = _environment(value, tests_dir, f"{where}.environment")
        elif key == "working_dir":
            settings.working_dir = str(value)
        elif key == "extra_hosts":
            settings.extra_hosts = [str(host).replace("=", ":", 1) if "=" in str(host) else str(host) for host in value]
        elif key == "network_mode":
            if value != "none":
                raise ComposeNotSupported(f"{where}.network_mode: {value!r}; use task.toml's network_mode, or 'none'.")
            settings.no_network = True
        elif key == "shm_size":
            settings.shm_size = str(value)
        elif key == "healthcheck":
            settings.healthcheck = _healthcheck(value or {}, f"{where}.healthcheck")
        elif key == "deploy":
            _check_deploy(value, f"{where}.deploy")
        elif key == "volumes":
            if any(not _is_harbor_log_volume(volume) for volume in value or []):
                raise ComposeNotSupported(f"{where}.volumes: host mounts are not given to trials (the agent is untrusted); copy what the task needs in its Dockerfile.")
        else:
            raise ComposeNotSupported(f"{where}.{key} cannot be honoured by the local container sandbox; run this task in Harbor's 'docker' environment.")
    return settings


def _environment(value: Any, tests_dir: str, where: str) -> dict[str, str]:
    pairs = value.items() if isinstance(value, dict) else (str(item).split("=", 1) if "=" in str(item) else (str(item), "") for item in value or [])
    return {str(key): _literal("" if item is None else str(item).replace("${TEST_DIR}", tests_dir), f"{where}.{key}") for key, item in pairs}


def _literal(value: Any, where: str) -> str:
    """A compose string with ``$$`` unescaped. Compose would fill ``${VAR}`` from the host's
    environment: a task is someone else's data, so that is refused (task.toml's
    ``[environment.env]`` with the backend's ``task_env_passthrough`` is the way)."""
    text = str(value)
    if re.search(r"\$\{?[A-Za-z_]", text.replace("$$", "")):
        raise ComposeNotSupported(
            f"{where}: {text!r} reads a host variable; set it in task.toml's [environment.env] (allowed by the backend's task_env_passthrough)."
        )
    return text.replace("$$", "$")


def _healthcheck(value: dict[str, Any], where: str) -> str | None:
    """The check as one shell command (compose's string, CMD-SHELL or CMD forms); None when disabled."""
    test = value.get("test")
    if value.get("disable") or test is None or test == ["NONE"]:
        return None
    if isinstance(test, str):
        return _literal(test, where)
    kind, *rest = test
    if kind == "CMD-SHELL":
        return _literal(" ".join(rest), where)
    if kind == "CMD":
        return _literal(shlex.join(rest), where)
    raise ComposeNotSupported(f"{where}.test: {test!r} is not a string, [\"CMD\", ...] or [\"CMD-SHELL\", ...].")


def _check_deploy(value: Any, where: str) -> None:
    limits = ((value or {}).get("resources") or {}).get("limits") or {}
    if set(value or {}) - {"resources"} or set(limits) - {"cpus", "memory"} or any(str(v) not in ("${CPUS}", "${MEMORY}") for v in limits.values()):
        raise ComposeNotSupported(f"{where}: set cpus and memory_mb in task.toml's [environment]; they are enforced from there.")


def _is_harbor_log_volume(volume: Any) -> bool:
    """Harbor's own log mounts (``${HOST_..._PATH}:${ENV_..._PATH}``): copied out instead here."""
    return isinstance(volume, str) and volume.startswith("${") and "LOGS" in volume.upper()


def _json_list(parts: list[str]) -> str:
    """podman's --entrypoint takes a JSON array for a command with arguments."""
    return json.dumps(parts)
