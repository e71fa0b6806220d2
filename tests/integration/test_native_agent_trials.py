"""terminus-2 and mini-swe-agent in real harbor trials, against the scripted model server.

Each agent solves ``examples/tasks/reward-txt`` in the bubblewrap sandbox, driven by the
replies in ``examples/model-scripts/<agent>-reward-txt.json``; the key the endpoint
requires is then looked for in everything a sweep keeps (archive and results).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.trial.trial import Trial
from paths import EXAMPLE_TASKS, REPO
from pydantic import SecretStr

from prefect_harbor.agents.native import MINI_SWE_AGENT_VERSION, native_agent_config, prepare_native_agent
from prefect_harbor.sandbox import IMPORT_PATH
from prefect_harbor.secrets import Redactor
from prefect_harbor.spec import Endpoint
from prefect_harbor.storage.archive import archive_row
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.testing.model_server import RecordedRequest, ScriptedModelServer
from prefect_harbor.trial.outcome import outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TASK = "reward-txt"
MODEL = "scripted"
#: Where harbor 0.25 writes the key in the raw trial tree. terminus-2 takes it in its
#: kwargs, which land verbatim in config.json, lock.json, result.json and the ATIF
#: trajectory's agent.extra.llm_kwargs. mini-swe-agent takes it in the agent env, which
#: harbor masks in what it writes ("sk-p****abc": first four and last three characters).
RAW_KEY_LOCATIONS = {
    "terminus-2": {"config.json", "lock.json", "result.json", "agent/trajectory.json"},
    "mini-swe-agent": set(),
}


@dataclass
class NativeTrial:
    agent: str
    key: str
    result: TrialResult
    trial_dir: Path
    requests: list[RecordedRequest]
    #: Files of the raw trial tree holding the key, before anything scrubbed it.
    key_found_in: set[str]
    seconds: float


def files_containing(root: Path, needle: str) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle.encode() in p.read_bytes()}


def run_native_trial(agent: str, workdir: Path, *, mounted: bool = True) -> NativeTrial:
    key = f"sk-prefect-harbor-{uuid.uuid4().hex}"
    task = workdir / "task"
    shutil.copytree(EXAMPLE_TASKS / TASK, task)
    script = REPO / "examples" / "model-scripts" / f"{agent}-{TASK}.json"
    with ScriptedModelServer(script, api_key=key) as server:
        setup = native_agent_config(agent, MODEL, Endpoint(base_url=server.base_url, api_key=SecretStr(key)), {})
        assert setup.secrets == [key]
        config = TrialConfig(
            task=TaskConfig(path=task),
            trials_dir=workdir / "trials",
            trial_name=f"{agent}-{TASK}",
            agent=setup.agent,
            environment=EnvironmentConfig(import_path=IMPORT_PATH, mounts=(setup.mounts if mounted else None) or None),
        )
        started = time.monotonic()

        async def run() -> TrialResult:
            return await (await Trial.create(config)).run()

        result = asyncio.run(run())
        seconds = time.monotonic() - started
        requests = server.requests
    trial_dir = config.trials_dir / config.trial_name
    return NativeTrial(agent, key, result, trial_dir, requests, files_containing(trial_dir, key), seconds)


@pytest.fixture(scope="module")
def terminus(tmp_path_factory: pytest.TempPathFactory) -> NativeTrial:
    return run_native_trial("terminus-2", tmp_path_factory.mktemp("terminus-2"))


@pytest.fixture(scope="module")
def mini_swe_agent(tmp_path_factory: pytest.TempPathFactory) -> NativeTrial:
    # Once per machine: the environment is built from the package index into the cache
    # (and its bytecode compiled); later runs reuse it.
    prepare_native_agent("mini-swe-agent")
    return run_native_trial("mini-swe-agent", tmp_path_factory.mktemp("mini-swe-agent"))


def assert_solved_through_the_endpoint(trial: NativeTrial) -> None:
    error = trial.result.exception_info
    assert error is None, f"{error.exception_type}: {error.exception_message}"
    assert trial.result.verifier_result is not None and trial.result.verifier_result.rewards == {"reward": 1}
    completions = [r for r in trial.requests if r.path == "/v1/chat/completions"]
    assert len(completions) >= 2 and all(r.authorized and r.status == 200 for r in completions)
    # litellm strips the "openai/" it was given: the endpoint sees the model it serves.
    assert {r.body["model"] for r in completions} == {MODEL}
    assert trial.result.agent_result is not None and trial.result.agent_result.n_input_tokens > 0
    assert trial.seconds < 60, f"{trial.agent} took {trial.seconds:.1f} s"


def test_terminus_2_reaches_reward_1_against_the_scripted_model(terminus):
    assert_solved_through_the_endpoint(terminus)
    assert terminus.result.agent_info.name == "terminus-2"
    assert not (terminus.trial_dir / "agent" / "recording.cast").exists()


@pytest.mark.slow
def test_mini_swe_agent_reaches_reward_1_from_the_prepared_environment(mini_swe_agent):
    assert_solved_through_the_endpoint(mini_swe_agent)
    assert mini_swe_agent.result.agent_info.version == MINI_SWE_AGENT_VERSION
    assert (mini_swe_agent.trial_dir / "agent" / "trajectory.json").is_file(), "harbor's ATIF conversion ran"
    setup_log = (mini_swe_agent.trial_dir / "trial.log").read_text()
    assert "astral.sh" not in setup_log and "uv python install" not in setup_log, "nothing was downloaded"


def test_mini_swe_agent_without_its_mounts_fails_at_setup_naming_the_fix(tmp_path):
    prepare_native_agent("mini-swe-agent")
    trial = run_native_trial("mini-swe-agent", tmp_path, mounted=False)
    error = trial.result.exception_info
    assert error is not None and "not usable in this sandbox" in error.exception_message
    assert "prepare_native_agent" in error.exception_message
    assert trial.result.agent_execution is None and not trial.requests


@pytest.mark.parametrize("agent", ["terminus-2", pytest.param("mini-swe-agent", marks=pytest.mark.slow)])
def test_the_api_key_reaches_neither_the_archive_nor_the_result(agent, request, tmp_path):
    trial: NativeTrial = request.getfixturevalue("terminus" if agent == "terminus-2" else "mini_swe_agent")
    assert trial.key_found_in == RAW_KEY_LOCATIONS[agent], trial.key_found_in
    row = outcome(RowResult(row_index=0, row_id=f"{agent}-row", agent=agent, model=MODEL, status="failure", trial_name=trial.result.trial_name), trial.result)
    assert row.status == "success" and row.reward == 1.0
    store = RunStore(str(tmp_path / "results"), "run", fallback_dir=tmp_path / "fallback")
    report = archive_row(row, trial.trial_dir, store, Redactor.of([trial.key]))
    assert report.error is None and sorted(report.tree.scrubbed) == sorted(trial.key_found_in)
    archive = tmp_path / "results" / "run" / trial.result.trial_name
    archived = {str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file()}
    assert {"config.json", "result.json", "diagnostics.json", "trajectory.json"} <= archived
    assert files_containing(tmp_path / "results", trial.key) == set()
    assert trial.key not in row.model_dump_json()
    assert files_containing(trial.trial_dir, trial.key) == set(), "the local trial tree is scrubbed too"
