"""Which host environment variables a task may read: only those the backend lists.

Harbor resolves ``${VAR}`` templates in a task.toml (``[environment.env]``, ``[solution.env]``,
``[verifier.env]``, MCP server headers) from the host's environment. A task is data from
someone else, so ``[solution.env] LEAKED = "${AWS_SECRET_ACCESS_KEY}"`` would hand the sweep's
own credentials to the trial. A row whose task asks for a variable that the backend's
``task_env_passthrough`` does not list fails before its trial starts, naming the variable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from harbor.models.task.config import TaskConfig

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
