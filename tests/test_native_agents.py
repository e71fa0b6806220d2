"""Wiring rules of the native agents (Osmosis v0.3's bindings), without running a trial."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from harbor.agents.factory import AgentFactory
from pydantic import SecretStr

from prefect_harbor.agents.native import (
    NO_API_KEY,
    PREPARED_MINI_SWE_AGENT,
    litellm_model_name,
    native_agent_config,
    prepare_native_agent,
)
from prefect_harbor.agents.pyenvs import PreparedEnv
from prefect_harbor.config import DEFAULT_MODEL_NAME, ConfigurationError
from prefect_harbor.sandbox.network import gateway_address, reachable_from_sandbox
from prefect_harbor.spec import Endpoint

KEY = "sk-unit-test-key"
URL = "http://127.0.0.1:9999/v1"


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint(base_url=URL, api_key=SecretStr(KEY))


@pytest.fixture
def prepared(tmp_path: Path) -> PreparedEnv:
    """A stand-in for mini-swe-agent's prepared environment (nothing is installed)."""
    return PreparedEnv(path=tmp_path / "venv", base_prefix=tmp_path / "python", uv=tmp_path / "uv")


def prepared_mini_swe_agent() -> type:
    """The agent class, imported by the tests that use it: its module imports harbor's
    mini-swe-agent, which imports litellm (~4 s), and every fast-tier process collects this file."""
    from prefect_harbor.agents.prepared_mini_swe_agent import PreparedMiniSweAgent

    return PreparedMiniSweAgent


# ---------------------------------------------------------------- terminus-2


def test_terminus_gets_the_endpoint_in_kwargs_and_the_key_in_llm_kwargs(endpoint):
    setup = native_agent_config("terminus-2", "openai/m", endpoint, {})
    assert setup.agent.name == "terminus-2" and setup.agent.import_path is None
    assert setup.agent.model_name == "openai/m"
    assert setup.agent.kwargs == {
        "enable_summarize": False,
        "record_terminal_session": False,
        "api_base": URL,
        "llm_kwargs": {"api_key": KEY},
    }
    assert setup.mounts == [] and setup.secrets == [KEY]
    assert setup.agent.env == {}


def test_terminus_endpoint_wiring_beats_user_kwargs_and_merges_llm_kwargs(endpoint):
    user = {"api_base": "http://elsewhere/v1", "llm_kwargs": {"api_key": "user-key", "temperature": 0.3}, "max_turns": 5}
    setup = native_agent_config("terminus-2", "openai/m", endpoint, user)
    assert setup.agent.kwargs["api_base"] == URL
    assert setup.agent.kwargs["llm_kwargs"] == {"api_key": KEY, "temperature": 0.3}
    assert setup.agent.kwargs["max_turns"] == 5
    assert user["llm_kwargs"]["api_key"] == "user-key", "the caller's kwargs are not mutated"


def test_terminus_user_may_turn_summarization_and_recording_back_on(endpoint):
    setup = native_agent_config("terminus-2", "openai/m", endpoint, {"enable_summarize": True, "record_terminal_session": True})
    assert setup.agent.kwargs["enable_summarize"] is True
    assert setup.agent.kwargs["record_terminal_session"] is True


def test_terminus_config_is_accepted_by_harbor(endpoint, tmp_path):
    setup = native_agent_config("terminus-2", "scripted", endpoint, {"llm_kwargs": {"temperature": 0}})
    AgentFactory.run_preflight(setup.agent)
    agent = AgentFactory.create_agent_from_config(setup.agent, logs_dir=tmp_path)
    assert agent.name() == "terminus-2"
    assert agent._llm._api_base == URL


# ---------------------------------------------------------------- mini-swe-agent


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_mini_swe_agent_gets_the_endpoint_in_its_environment(endpoint, prepared):
    setup = native_agent_config("mini-swe-agent", "openai/m", endpoint, {"cost_limit": "3"}, prepared=prepared)
    assert setup.agent.name is None and setup.agent.import_path == PREPARED_MINI_SWE_AGENT
    assert setup.agent.model_name == "openai/m"
    in_sandbox = reachable_from_sandbox(URL)  # a loopback endpoint is reached through the relay
    assert urlsplit(in_sandbox).hostname == gateway_address() and in_sandbox.endswith("/v1")
    assert setup.agent.env == {
        "MSWEA_COST_TRACKING": "ignore_errors",
        "OPENAI_API_BASE": in_sandbox,
        "OPENAI_BASE_URL": in_sandbox,
        "OPENAI_API_KEY": KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    assert setup.agent.kwargs == {"cost_limit": "3", "prepared_env": str(prepared.path)}
    assert setup.mounts == prepared.mounts()
    assert all(m["read_only"] for m in setup.mounts)
    assert setup.secrets == [KEY]


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_mini_swe_agent_reasoning_effort_moves_into_its_own_config(endpoint, prepared, tmp_path):
    setup = native_agent_config("mini-swe-agent", "openai/m", endpoint, {"reasoning_effort": "low"}, prepared=prepared)
    assert "reasoning_effort" not in setup.agent.kwargs
    assert setup.agent.kwargs["config"] == {"model": {"model_kwargs": {"reasoning_effort": "low"}}}
    config_file = tmp_path / "mini.yaml"
    config_file.write_text("agent:\n  step_limit: 7\n")
    setup = native_agent_config("mini-swe-agent", "openai/m", endpoint, {"reasoning_effort": "high", "config_file": str(config_file)}, prepared=prepared)
    assert setup.agent.kwargs["config"] == {"agent": {"step_limit": 7}, "model": {"model_kwargs": {"reasoning_effort": "high"}}}
    assert "config_file" not in setup.agent.kwargs


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_mini_swe_agent_config_is_accepted_by_harbor(endpoint, prepared, tmp_path):
    PreparedMiniSweAgent = prepared_mini_swe_agent()
    setup = native_agent_config("mini-swe-agent", "scripted", endpoint, {}, prepared=prepared)
    AgentFactory.run_preflight(setup.agent)
    agent = AgentFactory.create_agent_from_config(setup.agent, logs_dir=tmp_path)
    assert isinstance(agent, PreparedMiniSweAgent) and agent.name() == "mini-swe-agent"
    assert str(prepared.path) in agent.get_version_command()


def test_prepared_mini_swe_agent_without_an_environment_is_refused(tmp_path):
    PreparedMiniSweAgent = prepared_mini_swe_agent()
    with pytest.raises(ValueError, match="prepared_env"):
        PreparedMiniSweAgent(logs_dir=tmp_path, model_name="openai/m")


# ---------------------------------------------------------------- oracle


def test_oracle_gets_no_endpoint_even_when_one_is_configured(endpoint):
    for given in (endpoint, None):
        setup = native_agent_config("oracle", None, given, {})
        assert setup.agent.name == "oracle" and setup.agent.model_name is None
        assert setup.agent.kwargs == {} and setup.agent.env == {}
        assert setup.mounts == [] and setup.secrets == []


# ---------------------------------------------------------------- model names and keys


@pytest.mark.parametrize(
    ("given", "wired"),
    [
        ("scripted", "openai/scripted"),
        ("openai/gpt-4o-mini", "openai/gpt-4o-mini"),
        ("hosted_vllm/my-model", "hosted_vllm/my-model"),
        ("Qwen/Qwen3-8B", "openai/Qwen/Qwen3-8B"),
        (" spaced ", "openai/spaced"),
    ],
)
def test_model_names_without_a_litellm_provider_get_openai(given, wired):
    assert litellm_model_name(given) == wired


def test_model_falls_back_to_the_endpoint_model_then_the_osmosis_default():
    with_model = Endpoint(base_url=URL, api_key=SecretStr(KEY), model="served-model")
    assert native_agent_config("terminus-2", None, with_model, {}).agent.model_name == "openai/served-model"
    assert native_agent_config("terminus-2", "row-model", with_model, {}).agent.model_name == "openai/row-model"
    assert native_agent_config("terminus-2", None, Endpoint(base_url=URL), {}).agent.model_name == DEFAULT_MODEL_NAME


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_an_endpoint_without_a_key_gets_a_placeholder_that_is_not_a_secret(prepared):
    for key in (None, SecretStr("")):
        keyless = Endpoint(base_url=URL, api_key=key)
        terminus = native_agent_config("terminus-2", "m", keyless, {})
        assert terminus.agent.kwargs["llm_kwargs"]["api_key"] == NO_API_KEY and terminus.secrets == []
        mini = native_agent_config("mini-swe-agent", "m", keyless, {}, prepared=prepared)
        assert mini.agent.env["OPENAI_API_KEY"] == NO_API_KEY and mini.secrets == []


# ---------------------------------------------------------------- failure modes, by name


@pytest.mark.parametrize("agent", ["terminus-2", "mini-swe-agent"])
def test_missing_endpoint_is_refused(agent, prepared):
    with pytest.raises(ConfigurationError, match=rf"{agent} needs a model endpoint.*--model-endpoint"):
        native_agent_config(agent, "m", None, {}, prepared=prepared)


@pytest.mark.parametrize("agent", ["terminus-2", "mini-swe-agent"])
@pytest.mark.parametrize("url", ["", "   "])
def test_empty_endpoint_is_refused(agent, url, prepared):
    empty = Endpoint.model_construct(base_url=url, api_key=SecretStr(KEY), model=None)
    with pytest.raises(ConfigurationError, match="cannot be wired to an empty model endpoint"):
        native_agent_config(agent, "m", empty, {}, prepared=prepared)


def test_unknown_native_agent_is_refused(endpoint):
    with pytest.raises(ConfigurationError, match=r"unknown native agent 'claude-code'; registered: \['mini-swe-agent', 'nop', 'oracle', 'terminus-2'\]"):
        native_agent_config("claude-code", "m", endpoint, {})
    with pytest.raises(ConfigurationError, match="unknown native agent"):
        prepare_native_agent("claude-code")


def test_non_mapping_kwargs_are_refused(endpoint, prepared):
    with pytest.raises(ConfigurationError, match="native_agent_kwargs: must be a mapping"):
        native_agent_config("terminus-2", "m", endpoint, ["api_base"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="llm_kwargs: must be a mapping"):
        native_agent_config("terminus-2", "m", endpoint, {"llm_kwargs": "temperature=0"})
    with pytest.raises(ConfigurationError, match="reasoning_effort: must be a string"):
        native_agent_config("mini-swe-agent", "m", endpoint, {"reasoning_effort": 3}, prepared=prepared)


def test_mini_swe_agent_config_and_config_file_together_are_refused(endpoint, prepared, tmp_path):
    with pytest.raises(ConfigurationError, match="mutually exclusive"):
        native_agent_config("mini-swe-agent", "m", endpoint, {"reasoning_effort": "low", "config": {}, "config_file": "x.yaml"}, prepared=prepared)
    with pytest.raises(ConfigurationError, match="config_file: cannot read"):
        native_agent_config("mini-swe-agent", "m", endpoint, {"reasoning_effort": "low", "config_file": str(tmp_path / "missing.yaml")}, prepared=prepared)


def test_empty_model_name_is_refused(endpoint):
    with pytest.raises(ConfigurationError, match="model_name: empty"):
        native_agent_config("terminus-2", "  ", endpoint, {})


def test_only_mini_swe_agent_needs_preparing():
    assert prepare_native_agent("oracle") == []
    assert prepare_native_agent("terminus-2") == []
