"""Which host environment variables a task may read: only those the backend lists.

Harbor resolves ``${VAR}`` templates in a task.toml (``[environment.env]``, ``[solution.env]``,
``[verifier.env]``, MCP server headers) from the host's environment. A task is data from
someone else, so ``[solution.env] LEAKED = "${AWS_SECRET_ACCESS_KEY}"`` would hand the sweep's
own credentials to the trial. A row whose task asks for a variable that the backend's
``task_env_passthrough`` does not list fails before its trial starts, naming the variable.

The same list is all a task's docker-compose.yaml may read with its ``${VAR}``
(:mod:`prefect_harbor.sandbox.interpolation`); there, as compose does, any other variable is
empty (or its default) with a WARNING. A passed-through value with a credential's name
(:func:`passed_through_secrets`) is one of the run's secrets, redacted wherever the sweep writes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from harbor.models.task.config import TaskConfig
from harbor.utils.env import is_bool_env_value, is_sensitive_env_key

from prefect_harbor.rows.sources import RowRejected

#: ``${NAME}`` or ``${NAME:-default}``, anywhere in a value (Harbor's header form is embedded).
TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-[^}]*)?\}")


def requested_host_variables(config: TaskConfig) -> Iterator[tuple[str, str]]:
    """``(variable, where)`` for every template in the task's config, e.g. ``("AWS_KEY", "[solution.env] LEAKED")``."""
    sections: list[tuple[str, dict[str, str]]] = [
        ("[environment.env]", config.environment.env),
        ("[solution.env]", config.solution.env),
        ("[verifier.env]", config.verifier.env),
        *((f"[steps.{step.name}.verifier.env]", step.verifier.env) for step in config.steps or []),
        *((f"[environment.mcp_servers.{server.name}.headers]", server.headers) for server in config.environment.mcp_servers),
    ]
    for section, values in sections:
        for key, value in values.items():
            for match in TEMPLATE.finditer(value):
                yield match.group(1), f"{section} {key}"


def refuse_unlisted_host_variables(task_dir: Path, task_name: str, allowed: Iterable[str]) -> None:
    """Raise :class:`RowRejected` if the task's templates name a variable outside ``allowed``.

    An unparsable task.toml is left to Harbor, which reports it when the trial is created.
    """
    try:
        config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    except (OSError, ValueError):
        return
    permitted = set(allowed)
    refused = [(variable, where) for variable, where in requested_host_variables(config) if variable not in permitted]
    if refused:
        named = ", ".join(f"{variable} (in {where})" for variable, where in refused)
        raise RowRejected(
            f"task {task_name!r} asks for host environment variables {named}; a task may read only the variables "
            "listed in the backend's task_env_passthrough field: add them there if this task should see them."
        )


def passed_through_secrets(names: Iterable[str]) -> list[str]:
    """The host's values of the passed-through variables whose names say credential (Harbor's
    rule: KEY, SECRET, TOKEN, PASSWORD, CREDENTIAL, AUTH), for the run's redactor; flags such
    as ``GH_TOKEN_ENABLED=1`` are not secrets worth the name."""
    values = (os.environ.get(name, "") for name in names if is_sensitive_env_key(name))
    return [value for value in values if value and not is_bool_env_value(value)]
