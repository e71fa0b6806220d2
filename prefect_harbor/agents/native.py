"""Harbor's native agents bound to a model endpoint, the Osmosis v0.3 way.

Osmosis's ``HarborBackend`` runs three native Harbor agents by name, each told about
the rollout's model endpoint in its own way:

* ``terminus-2`` runs its LLM loop in the host process through litellm and drives tmux
  inside the sandbox. The endpoint goes into its kwargs: ``api_base`` and the key inside
  ``llm_kwargs`` (a top-level ``api_key`` is ignored by terminus-2). Context
  summarization is off (it rewrites history, forking the token trajectory) and, here,
  so is asciinema recording (not installed, and not installable offline), unless the
  user's kwargs say otherwise.
* ``mini-swe-agent`` runs INSIDE the sandbox and reads the endpoint from the
  environment (``OPENAI_BASE_URL`` and ``OPENAI_API_BASE``, both: a stray host value
  must never outrank the rollout's endpoint; ``OPENAI_API_KEY``), with cost tracking
  errors ignored (a private model has no price). Harbor's own install downloads uv and
  a Python build; here it is :class:`~prefect_harbor.agents.prepared_mini_swe_agent.PreparedMiniSweAgent`, which uses a virtual
  environment prepared once on the host (:func:`prepare_native_agent`) and mounted
  read-only into every sandbox.
* ``oracle`` runs the task's reference solution and ``nop`` does nothing: no model, no endpoint.

Endpoint wiring beats the user's ``native_agent_kwargs`` (a user ``api_base`` is
overridden); the user's ``llm_kwargs`` are merged under the key. A model agent with no
endpoint, or an endpoint without a URL, is refused before any trial starts.

The API key ends up, verbatim, in the trial's ``config.json`` and ``result.json`` (and
the agent's environment): :attr:`NativeAgentSetup.secrets` lists what the archive must
scrub.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from harbor.models.trial.config import AgentConfig

from prefect_harbor.agents.pyenvs import PreparedEnv, cache_root, prepare_env
from prefect_harbor.config import DEFAULT_MODEL_NAME, NATIVE_AGENTS, ConfigurationError
from prefect_harbor.sandbox.network import reachable_from_sandbox
from prefect_harbor.spec import Endpoint

#: The mini-swe-agent release the prepared environment holds: a 2.x (harbor 0.25 drives
#: mini-swe-agent v2: ``-c`` spec lists, tool-call trajectories), checked with harbor's runner.
MINI_SWE_AGENT_VERSION = "2.4.6"
#: What harbor's own install adds next to mini-swe-agent (``uv tool install --with ...``).
MINI_SWE_AGENT_REQUIREMENTS = (f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}", "litellm", "orjson", "fastapi")
#: The import path of the offline mini-swe-agent (``AgentConfig.import_path``).
#: In a module of its own: importing Harbor's mini-swe-agent loads litellm (about 4 s per process),
#: which only a trial of that agent needs.
PREPARED_MINI_SWE_AGENT = "prefect_harbor.agents.prepared_mini_swe_agent:PreparedMiniSweAgent"
#: Sent as the key when the endpoint has none: an explicit value keeps the agents from
#: falling back to a host credential (``OPENAI_API_KEY``) and sending it to the endpoint.
NO_API_KEY = "EMPTY"
#: The native agents that need a model endpoint.
MODEL_AGENTS = frozenset({"terminus-2", "mini-swe-agent"})


@dataclass(frozen=True)
class NativeAgentSetup:
    """What a trial of a native agent needs: its agent config, extra mounts, secrets."""

    agent: AgentConfig
    #: Harbor ``EnvironmentConfig.mounts`` entries to add (read-only bind mounts).
    mounts: list[dict[str, Any]] = field(default_factory=list)
    #: Values that must be scrubbed from the trial tree before anything is kept.
    secrets: list[str] = field(default_factory=list)


def native_agent_config(
    agent: str,
    model_name: str | None,
    endpoint: Endpoint | None,
    user_kwargs: dict[str, Any] | None = None,
    *,
    prepared: PreparedEnv | None = None,
) -> NativeAgentSetup:
    """The harbor agent config of a native agent wired to ``endpoint``.

    ``model_name`` is the model already chosen for the row (``metadata.harbor_model``,
    else the backend's); when None, the endpoint's model, else Osmosis's default. A name
    without a litellm provider prefix gets ``openai/`` (the endpoint speaks OpenAI's
    API). ``prepared`` is mini-swe-agent's environment (prepared on first use if None).
    """
    if agent not in NATIVE_AGENTS:
        raise ConfigurationError(f"agent: unknown native agent {agent!r}; registered: {sorted(NATIVE_AGENTS)}.")
    if user_kwargs is not None and not isinstance(user_kwargs, dict):
        raise ConfigurationError(f"native_agent_kwargs: must be a mapping, got {type(user_kwargs).__name__}.")
    kwargs = copy.deepcopy(dict(user_kwargs or {}))
    if agent not in MODEL_AGENTS:  # oracle, nop: no model, no endpoint
        return NativeAgentSetup(agent=AgentConfig(name=agent, model_name=model_name, kwargs=kwargs))
    url, key = _endpoint_parts(agent, endpoint)
    model = litellm_model_name(model_name or (endpoint.model if endpoint else None) or DEFAULT_MODEL_NAME)
    secrets = [key] if key != NO_API_KEY else []
    if agent == "terminus-2":
        return NativeAgentSetup(agent=_terminus_config(model, url, key, kwargs), secrets=secrets)
    env = prepared or _prepared_env(agent)
    return NativeAgentSetup(agent=_mini_swe_agent_config(model, url, key, kwargs, env), mounts=env.mounts(), secrets=secrets)


def _endpoint_parts(agent: str, endpoint: Endpoint | None) -> tuple[str, str]:
    fix = "give the sweep a model endpoint (--model-endpoint BLOCK, or --model-base-url URL --model-api-key-env VAR)"
    if endpoint is None:
        raise ConfigurationError(f"agent: {agent} needs a model endpoint and none is configured; {fix}.")
    url = (endpoint.base_url or "").strip().rstrip("/")
    if not url:
        raise ConfigurationError(f"agent: {agent} cannot be wired to an empty model endpoint (no base URL); {fix}.")
    key = endpoint.api_key.get_secret_value() if endpoint.api_key is not None else ""
    return url, key or NO_API_KEY


def litellm_model_name(model: str) -> str:
    """``model`` as litellm must see it for an OpenAI-compatible endpoint.

    A name whose first segment is a litellm provider (``openai/x``, ``hosted_vllm/x``)
    is kept; any other (``x``, ``Qwen/Qwen3-8B``) gets ``openai/``, which litellm strips
    again before sending the request, so the endpoint sees the name it was given.
    """
    model = model.strip()
    if not model:
        raise ConfigurationError("model_name: empty; name the model the endpoint serves (--model NAME).")
    from litellm import provider_list  # litellm is slow to import: only for model agents

    provider, separator, _ = model.partition("/")
    if separator and provider in provider_list:
        return model
    return f"openai/{model}"


def _terminus_config(model: str, url: str, key: str, kwargs: dict[str, Any]) -> AgentConfig:
    llm_kwargs = kwargs.pop("llm_kwargs", None) or {}
    if not isinstance(llm_kwargs, dict):
        raise ConfigurationError(f"native_agent_kwargs.llm_kwargs: must be a mapping, got {type(llm_kwargs).__name__}.")
    kwargs = {"enable_summarize": False, "record_terminal_session": False, **kwargs}
    kwargs["api_base"] = url
    kwargs["llm_kwargs"] = {**llm_kwargs, "api_key": key}
    return AgentConfig(name="terminus-2", model_name=model, kwargs=kwargs)


def _mini_swe_agent_config(model: str, url: str, key: str, kwargs: dict[str, Any], env: PreparedEnv) -> AgentConfig:
    effort = kwargs.pop("reasoning_effort", None)
    if effort:
        # Harbor's top-level effort switches openai/* models to the Responses API even
        # for a chat-completions endpoint; inside mini's own config the endpoint stays.
        if not isinstance(effort, str):
            raise ConfigurationError(f"native_agent_kwargs.reasoning_effort: must be a string, got {type(effort).__name__}.")
        config = _mini_config(kwargs)
        model_section = config.setdefault("model", {})
        if not isinstance(model_section, dict) or not isinstance(model_section.setdefault("model_kwargs", {}), dict):
            raise ConfigurationError("native_agent_kwargs.config: 'model' and 'model.model_kwargs' must be mappings.")
        model_section["model_kwargs"]["reasoning_effort"] = effort
        kwargs["config"] = config
    kwargs["prepared_env"] = str(env.path)
    url = reachable_from_sandbox(url)  # mini-swe-agent calls the model from inside the container
    agent_env = {
        "MSWEA_COST_TRACKING": "ignore_errors",
        "OPENAI_API_BASE": url,
        "OPENAI_BASE_URL": url,
        "OPENAI_API_KEY": key,
        # litellm otherwise fetches its model-cost map from the internet at import.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **env.library_env(),
    }
    return AgentConfig(name=None, import_path=PREPARED_MINI_SWE_AGENT, model_name=model, env=agent_env, kwargs=kwargs)


def _mini_config(kwargs: dict[str, Any]) -> dict[str, Any]:
    config, config_file = kwargs.get("config"), kwargs.pop("config_file", None)
    if config is not None and config_file is not None:
        raise ConfigurationError("native_agent_kwargs: 'config' and 'config_file' are mutually exclusive; give one.")
    if config_file:
        try:
            config = yaml.safe_load(Path(config_file).read_text())
        except (OSError, yaml.YAMLError) as error:
            raise ConfigurationError(f"native_agent_kwargs.config_file: cannot read {config_file}: {error}.") from error
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise ConfigurationError("native_agent_kwargs.config: the mini-swe-agent config must be a mapping.")
    return config


# --------------------------------------------------------------------------- preparation

_prepared: dict[tuple[str, Path], PreparedEnv] = {}
_prepared_lock = threading.Lock()


def prepare_native_agent(agent: str, *, logger: logging.Logger | logging.LoggerAdapter | None = None) -> list[dict[str, Any]]:
    """Prepare what ``agent`` needs on the host, once; return the mounts its trials need.

    Idempotent and cheap after the first call (in-process memo, then the content-addressed
    cache of :mod:`prefect_harbor.agents.pyenvs`). Only mini-swe-agent needs anything: its
    environment, built from the package index into the cache. Call it before any trial.
    """
    if agent not in NATIVE_AGENTS:
        raise ConfigurationError(f"agent: unknown native agent {agent!r}; registered: {sorted(NATIVE_AGENTS)}.")
    if agent != "mini-swe-agent":
        return []
    return _prepared_env(agent, logger).mounts()


def _prepared_env(agent: str, logger: logging.Logger | logging.LoggerAdapter | None = None) -> PreparedEnv:
    key = (agent, cache_root())
    with _prepared_lock:
        env = _prepared.get(key)
        if env is None or not Path(env.python).exists():
            env, _ = prepare_env(list(MINI_SWE_AGENT_REQUIREMENTS), logger=logger)
            _prepared[key] = env
        return env

