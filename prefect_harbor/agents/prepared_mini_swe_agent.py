"""Harbor's mini-swe-agent, run from an environment prepared on the host (``agents.native``).

Imported by Harbor through the agent's import path, only in trials of this agent: Harbor's
``MiniSweAgent`` module loads litellm, which costs every other process seconds.
"""

from __future__ import annotations

import shlex
from typing import Any, override

from harbor.agents.installed.mini_swe_agent import MiniSweAgent, MiniSweAgentOptions
from harbor.environments.base import BaseEnvironment
from pydantic import Field


class PreparedMiniSweAgentOptions(MiniSweAgentOptions):
    prepared_env: str | None = Field(default=None, description="The prepared mini-swe-agent environment (a host path mounted at the same path).")


class PreparedMiniSweAgent(MiniSweAgent):
    """Harbor's mini-swe-agent, run from a prepared environment mounted into the sandbox.

    ``install()`` downloads nothing: it checks that the environment is visible and
    works, and links its ``mini-swe-agent`` script into ``$HOME/.local/bin``, where
    harbor's runner looks for it. Only that one script joins the agent's ``PATH``: the
    environment's Python does not shadow the task's.
    """

    options_model = PreparedMiniSweAgentOptions
    options: PreparedMiniSweAgentOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.options.prepared_env:
            raise ValueError("PreparedMiniSweAgent needs prepared_env=<venv path>: use prefect_harbor.agents.native.native_agent_config")
        self._prepared_env = self.options.prepared_env

    @override
    def get_version_command(self) -> str | None:
        python = shlex.quote(f"{self._prepared_env}/bin/python")
        return f"{python} -c 'import importlib.metadata as m; print(m.version(\"mini-swe-agent\"))'"

    @override
    async def install(self, environment: BaseEnvironment) -> None:
        venv = shlex.quote(self._prepared_env)
        await self.exec_as_agent(
            environment,
            command=(
                f"if [ ! -x {venv}/bin/mini-swe-agent ]; then "
                f"echo {venv}: 'the prepared mini-swe-agent environment is not usable in this sandbox: mount it "
                "(the mounts of prepare_native_agent(\"mini-swe-agent\") in the environment config) "
                "and let the agent user read it' >&2; exit 1; fi; "
                f"{venv}/bin/python -c 'import minisweagent' && "
                'mkdir -p "$HOME/.local/bin" && '
                f'ln -sfn {venv}/bin/mini-swe-agent "$HOME/.local/bin/mini-swe-agent"'
            ),
        )
