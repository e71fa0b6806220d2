"""Row -> task copy -> result mapping, without running a sandbox."""

import json
import logging
import re
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.result import TimingInfo
from harbor.models.verifier.result import VerifierResult
from paths import EXAMPLE_TASKS
from pydantic import ValidationError
from trial_results import exception_info
from trial_results import trial_result as real_trial_result

from prefect_harbor.agents.bundles import Bundle
from prefect_harbor.agents.harness import BundleRuntime
from prefect_harbor.agents.pyenvs import prepare_env
from prefect_harbor.blocks import HarborBackend, ModelEndpoint
from prefect_harbor.rows.dataset import DatasetRow, RowProblem
from prefect_harbor.rows.sources import ResolvedTask, RowRejected, TaskResolver
from prefect_harbor.sandbox.images import image_resolver
from prefect_harbor.storage.results import RowResult
from prefect_harbor.trial.outcome import outcome
from prefect_harbor.trial.row_trial import (
    RunContext,
    base_result,
    build_trial_config,
    cancelled_result,
    environment_kwargs,
    model_for,
    prepare_task,
    run_row,
    trial_name_for,
    validate_task,
)  # fmt: skip

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LOG = logging.getLogger("test")


def dataset_backend(**kwargs):
    return HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", **kwargs).spec()


def template_backend(task="reward-txt", **kwargs):
    return HarborBackend(tasks_dir=EXAMPLE_TASKS / task, task_mode="template", agent="oracle", **kwargs).spec()


def a_task(tmp_path, instruction=True, tests=True):
    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text("")
    if tests:
        (task / "tests" / "test.sh").write_text("#!/bin/bash\n")
    if instruction:
        (task / "instruction.md").write_text("the task's own instruction")
    return task


async def test_dataset_mode_selects_the_task_and_keeps_its_instruction(tmp_path):
    backend = dataset_backend()
    row = DatasetRow(id="r", prompt="ignored in dataset mode", metadata={"harbor_task_id": "reward-txt"})
    task = await TaskResolver(backend.sources, tmp_path).resolve(row)
    path = prepare_task(row, backend, task, tmp_path / "copy", LOG)
    assert task.name == "reward-txt"
    assert (path / "instruction.md").read_text() == (EXAMPLE_TASKS / "reward-txt" / "instruction.md").read_text()


@pytest.mark.parametrize("task_id", ["../reward-txt", "/etc", "no-such-task", "."])
async def test_dataset_mode_refuses_ids_outside_the_root_or_missing(tmp_path, task_id):
    row = DatasetRow(id="r", metadata={"harbor_task_id": task_id})
    with pytest.raises(RowRejected, match="unknown harbor task id"):
        await TaskResolver(dataset_backend().sources, tmp_path).resolve(row)


async def test_dataset_mode_needs_a_task_id(tmp_path):
    with pytest.raises(RowRejected, match="needs metadata.harbor_task_id"):
        await TaskResolver(dataset_backend().sources, tmp_path).resolve(DatasetRow(id="r"))


def test_template_mode_writes_the_prompt_exactly_as_osmosis(tmp_path):
    backend = template_backend()
    messages = [{"role": "user", "content": "Schreib «hallo»"}]
    task = ResolvedTask(name="reward-txt", path=backend.sources.tasks_dir)
    path = prepare_task(DatasetRow(id="r", prompt=messages), backend, task, tmp_path / "copy", LOG)
    assert (path / "instruction.md").read_text() == json.dumps(messages, default=str)
    assert "\\u00ab" in (path / "instruction.md").read_text()  # ASCII-escaped, one line


def test_template_mode_without_prompt_or_instruction_fails_the_row(tmp_path):
    task = a_task(tmp_path, instruction=False)
    backend = HarborBackend(tasks_dir=task, agent="oracle").spec()
    with pytest.raises(RowRejected, match="task task has no instruction and no prompt"):
        prepare_task(DatasetRow(id="r"), backend, ResolvedTask("task", task), tmp_path / "copy", LOG)


def test_a_dynamic_task_whose_instruction_is_overwritten_is_warned_about(tmp_path, caplog):
    task = a_task(tmp_path)
    backend = template_backend()
    with caplog.at_level(logging.WARNING, logger="test"):
        prepare_task(DatasetRow(id="r", prompt="new"), backend, ResolvedTask("task", task, dynamic=True), tmp_path / "copy", LOG)
    assert "brings its own instruction.md" in caplog.text


def test_a_task_without_tests_and_without_a_grader_fails_the_row(tmp_path):
    task = a_task(tmp_path, tests=False)
    with pytest.raises(RowRejected, match="has no reward source"):
        prepare_task(DatasetRow(id="r", prompt="p"), dataset_backend(), ResolvedTask("task", task), tmp_path / "copy", LOG)


def test_tasks_with_symlinks_are_refused(tmp_path):
    task = a_task(tmp_path)
    (task / "tests" / "link").symlink_to("/etc/passwd")
    with pytest.raises(RowRejected, match="symlink"):
        prepare_task(DatasetRow(id="r", prompt="p"), template_backend(), ResolvedTask("task", task), tmp_path / "copy", LOG)


def test_harbor_model_overrides_the_model_for_native_agents_only():
    row = DatasetRow(id="r", metadata={"harbor_model": "openai/other"})
    endpoint = ModelEndpoint(base_url="http://127.0.0.1:9/v1")
    native = HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="terminus-2", model_endpoint=endpoint).spec()
    workflow = HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="pkg.mod:Workflow").spec()
    assert model_for(native, row) == "openai/other"
    assert model_for(workflow, row) == "openai/osmosis-rollout"
    assert model_for(template_backend(), row) is None  # oracle needs no model


def test_trial_names_are_filesystem_safe_and_unique():
    first, second = trial_name_for("a/b c:d"), trial_name_for("a/b c:d")
    assert first.startswith("a_b_c_d__") and first != second


def trial_result(rewards=None, error=None, error_at=None, verifier=True):
    return real_trial_result(
        exception_info=None if error is None else exception_info(error, error_at or T0),
        verifier_result=None if rewards is None else VerifierResult(rewards=rewards),
        environment_setup=TimingInfo(started_at=T0, finished_at=T0 + timedelta(seconds=1)),
        agent_setup=TimingInfo(started_at=T0 + timedelta(seconds=1), finished_at=T0 + timedelta(seconds=2)),
        agent_execution=TimingInfo(started_at=T0 + timedelta(seconds=2), finished_at=T0 + timedelta(seconds=5)),
        verifier=TimingInfo(started_at=T0 + timedelta(seconds=5), finished_at=T0 + timedelta(seconds=6)) if verifier else None,
        started_at=T0,
        finished_at=T0 + timedelta(seconds=6),
        agent_result=None,
    )


BASE = RowResult(row_index=0, row_id="r", status="failure")


def test_the_reward_key_decides_and_other_keys_are_kept():
    result = outcome(BASE, trial_result({"reward": 0.5, "style": 1}))
    assert (result.status, result.reward, result.rewards) == ("success", 0.5, {"reward": 0.5, "style": 1.0})
    assert (result.agent_sec, result.total_sec) == (3.0, 6.0)


def test_rewards_without_the_reward_key_fail_validation():
    result = outcome(BASE, trial_result({"style": 1.0}))
    assert (result.status, result.err_category) == ("failure", "validation_error")
    assert "Sample has no reward after grading" in result.err_message


def test_an_agent_phase_failure_stays_the_reported_cause():
    result = outcome(BASE, trial_result({"reward": 0.0}, error="AgentTimeoutError", error_at=T0 + timedelta(seconds=3)))
    assert (result.status, result.err_category, result.err_phase) == ("failure", "timeout", "agent")
    assert result.rewards == {"reward": 0.0}


@pytest.mark.parametrize(
    "error,at,category,cause",
    [
        ("EnvironmentStartTimeoutError", 0, "timeout", "sandbox_failed"),
        ("AgentTimeoutError", 3, "timeout", "agent_exhausted_budget"),
        ("NonZeroAgentExitCodeError", 3, "agent_error", "unclassified"),
        ("AuthenticationError", 3, "agent_error", "model_provider_failed"),
        ("RewardFileNotFoundError", 5.005, "verifier_error", "verifier_failed"),
    ],
)
def test_a_failure_reads_in_osmosiss_words_and_harbors_alike(error, at, category, cause):
    """Osmosis calls an environment that did not start in time a timeout; Harbor's error policy calls it a sandbox failure: the row keeps both."""
    result = outcome(BASE, trial_result(None, error=error, error_at=T0 + timedelta(seconds=at)))
    assert (result.status, result.err_category, result.exception_type, result.failure_cause) == ("failure", category, error, cause)


def test_a_success_has_no_failure_cause():
    assert outcome(BASE, trial_result({"reward": 1.0})).failure_cause is None


def test_a_verifier_failure_is_a_verifier_error_not_a_scored_zero():
    base = BASE.model_copy(update={"task": "no-reward"})
    result = outcome(base, trial_result(None, error="RewardFileNotFoundError", error_at=T0 + timedelta(seconds=5, milliseconds=5)))
    assert (result.status, result.err_category, result.err_phase, result.reward) == ("failure", "verifier_error", "verifier", None)
    assert result.err_message.startswith("task 'no-reward': its tests/test.sh ended without writing a reward (Harbor reads /logs/verifier/reward.txt")


def test_a_reward_json_that_is_not_an_object_names_the_file_and_the_fix():
    result = outcome(BASE, trial_result(None, error="ValidationError", error_at=T0 + timedelta(seconds=5, milliseconds=5)).model_copy(
        update={"exception_info": exception_info("ValidationError", T0 + timedelta(seconds=5, milliseconds=5), "Input should be a valid dictionary")}
    ))  # fmt: skip
    assert (result.err_category, result.err_phase) == ("verifier_error", "verifier")
    assert "verifier/reward.json must hold a JSON object of numbers" in result.err_message


def test_a_boolean_reward_is_not_a_number(tmp_path):
    """Harbor's result model turns a JSON ``true`` into 1; the reward file as written decides."""
    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "reward.json").write_text('{"reward": true}')
    result = outcome(BASE, trial_result({"reward": True}).model_copy(update={"trial_uri": tmp_path.as_uri()}))
    assert (result.status, result.err_category, result.reward) == ("failure", "verifier_error", None)
    assert "'reward' is True" in result.err_message and "a boolean is not one" in result.err_message


def test_no_verifier_and_no_error_means_no_reward_source():
    result = outcome(BASE, trial_result(None, verifier=False))
    assert result.status == "failure" and "no reward source" in result.err_message


def test_cancelled_trials_are_cancelled_rows():
    assert outcome(BASE, trial_result(None, error="CancelledError")).status == "cancelled"


def test_a_finished_trials_loggers_are_forgotten():
    """Harbor names a logger per trial; logging would keep them (and the placeholders' links) for ever."""
    import logging

    from prefect_harbor.trial.row_trial import forget_loggers

    trial = logging.getLogger("forget-test.trial.row1__abc")
    logging.getLogger("forget-test.trial.row1__abc.agents.base")
    other = logging.getLogger("forget-test.trial.row2__def")
    forget_loggers(trial.name)
    registry = logging.Logger.manager.loggerDict
    assert [name for name in registry if name.startswith("forget-test.trial.row1__abc")] == []
    assert list(registry["forget-test.trial"].loggerMap) == [other]
    assert logging.getLogger("forget-test.trial.row2__def") is other


@pytest.mark.parametrize(("patch", "baked"), [(None, True), (True, True), (False, False)], ids=["default", "on", "off"])
def test_patch_dockerfile_with_sdk_bakes_the_bundle_environment_instead_of_mounting_it(tmp_path, patch, baked):
    env, _ = prepare_env([], root=tmp_path)
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    wheel.write_bytes(b"")
    run = RunContext(run_id="r", trials_dir=tmp_path / "trials", bundle=BundleRuntime(Bundle(wheel, "pkg-agent", "pkg-grade", ()), env))
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", task_mode="template", agent="pkg.mod:Workflow", patch_dockerfile_with_sdk=patch).spec()
    row = DatasetRow(id="r1", prompt=[{"role": "user", "content": "hi"}])
    config = build_trial_config(backend, row, EXAMPLE_TASKS / "reward-txt", run, "r1__x")
    mounted = {m["target"] for m in config.environment.mounts or []}
    assert (str(env.path) in mounted) is not baked
    baked_targets = {pair["target"] for pair in config.environment.kwargs.get("baked_paths", [])}
    assert baked_targets == ({str(env.base_prefix), str(env.path), str(env.uv), str(env.libs)} if baked else set())
    assert environment_kwargs(backend, run) == config.environment.kwargs, "prewarm must build the image the trials use"


@pytest.mark.parametrize("force_build", [False, True])
def test_force_build_reaches_harbors_environment_config_as_harbor_run_force_build_sets_it(tmp_path, force_build):
    """Harbor's trial passes EnvironmentConfig.force_build to the environment's start(force_build)."""
    run = RunContext(run_id="r", trials_dir=tmp_path / "trials")
    config = build_trial_config(template_backend(force_build=force_build), DatasetRow(id="r1", prompt="hi"), EXAMPLE_TASKS / "reward-txt", run, "r1__x")
    assert config.environment.force_build is force_build


@pytest.mark.parametrize(
    ("environment", "named"),
    [("gpus = 1", "gpus = 1"), ('gpu_types = ["H100"]', "gpu_types = ['H100']"), ('tpu = { type = "v5e", topology = "2x2" }', "tpu = {")],
)
def test_a_task_asking_for_gpus_or_tpus_is_refused_before_any_trial_naming_the_key(tmp_path, environment, named):
    task = shutil.copytree(EXAMPLE_TASKS / "reward-txt", tmp_path / "gpu-task")
    (task / "task.toml").write_text((task / "task.toml").read_text().replace("[environment]", f"[environment]\n{environment}", 1))
    assert f"[environment]\n{environment}" in (task / "task.toml").read_text()
    with pytest.raises(RowRejected, match=re.escape(f"task 'gpu-task': [environment] {named}") + ".*gives trials no GPU or TPU.*--shards"):
        validate_task(ResolvedTask("gpu-task", task), dataset_backend())
    docker = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", environment={"type": "docker"}).spec()
    assert validate_task(ResolvedTask("gpu-task", task), docker), "another Harbor environment decides for itself"


@pytest.mark.parametrize(
    ("appended", "named"),
    [
        ('[agent]\nnetwork_mode = "no-network"\n', "[agent] network_mode = 'no-network' differs from [environment] network_mode = 'public'"),
        ('[verifier]\nnetwork_mode = "no-network"\n', "[verifier] network_mode = 'no-network'"),
    ],
)
def test_a_task_whose_phases_need_another_network_is_refused_before_any_trial_naming_the_key(tmp_path, appended, named):
    """Harbor switches a running trial's network between phases where its environment can; the local sandbox cannot."""
    task = shutil.copytree(EXAMPLE_TASKS / "reward-txt", tmp_path / "phases")
    table = appended.split("\n", 1)[0]
    text = (task / "task.toml").read_text()
    assert table in text
    (task / "task.toml").write_text(text.replace(table, appended.rstrip("\n"), 1))
    with pytest.raises(RowRejected, match=re.escape(f"task 'phases': {named}") + ".*cannot change that while the trial runs"):
        validate_task(ResolvedTask("phases", task), dataset_backend())
    same = shutil.copytree(task, tmp_path / "same")
    (same / "task.toml").write_text((task / "task.toml").read_text().replace('"no-network"', '"public"'))
    assert validate_task(ResolvedTask("same", same), dataset_backend()), "a phase naming the environment's own mode is fine"
    restricted = shutil.copytree(task, tmp_path / "restricted")
    text = (task / "task.toml").read_text().replace('"no-network"', '"allowlist"\nallowed_hosts = ["pypi.org"]')
    (restricted / "task.toml").write_text(text.replace("[environment]", '[environment]\nnetwork_mode = "no-network"', 1))
    assert validate_task(ResolvedTask("restricted", restricted), dataset_backend()), "no-network and allowlist phases switch the proxy's list"


def test_timeout_multipliers_reach_harbors_trial_config_and_the_sandboxs_builds(tmp_path):
    """As `harbor run --timeout-multiplier` and its per-phase flags: Harbor's trial multiplies each
    phase; the local sandbox's builds (prewarm's too) get the build's multiplier."""
    run = RunContext(run_id="r", trials_dir=tmp_path / "trials")
    backend = template_backend(timeout_multiplier=2.0, verifier_timeout_multiplier=0.5, environment_build_timeout_multiplier=3.0)
    config = build_trial_config(backend, DatasetRow(id="r1", prompt="hi"), EXAMPLE_TASKS / "reward-txt", run, "r1__x")
    assert (config.timeout_multiplier, config.agent_timeout_multiplier, config.verifier_timeout_multiplier) == (2.0, None, 0.5)
    assert (config.agent_setup_timeout_multiplier, config.environment_build_timeout_multiplier) == (None, 3.0)
    assert config.environment.kwargs["build_timeout_multiplier"] == 3.0 == environment_kwargs(backend, run)["build_timeout_multiplier"]
    resolver = image_resolver(extra_ca_certs=[], **config.environment.kwargs)
    assert resolver.build_timeout_sec(EnvironmentConfig(build_timeout_sec=600)) == 1800
    plain = build_trial_config(template_backend(), DatasetRow(id="r1", prompt="hi"), EXAMPLE_TASKS / "reward-txt", run, "r1__x")
    assert plain.timeout_multiplier == 1.0 and "build_timeout_multiplier" not in plain.environment.kwargs
    with pytest.raises(ValidationError, match="timeout_multiplier"):
        template_backend(agent_timeout_multiplier=0)


@pytest.mark.parametrize(
    ("backend", "metadata", "task"),
    [
        (dataset_backend(), {"harbor_task_id": "reward-txt"}, "reward-txt"),
        (template_backend(), {}, "reward-txt"),
        (dataset_backend(), {"harbor_task": "./elsewhere/hello-task"}, "hello-task"),
        (dataset_backend(), {"harbor_task": "acme/solver@sha256:abc"}, "acme/solver"),
    ],
    ids=["dataset", "template", "local-path", "package"],
)
def test_a_row_cancelled_before_it_started_keeps_its_task(backend, metadata, task):
    row = DatasetRow(id="q0", metadata=metadata)
    result = cancelled_result(base_result(row, 0, backend), None, None, started=False)
    assert (result.status, result.task, result.err_message) == ("cancelled", task, "cancelled before it started")


@pytest.mark.parametrize(
    ("spec", "reward"), [("reward", None), ("correctness", 1.0), ("mean(correctness, performance)", 0.75), ("min(correctness, performance)", 0.5)]
)
def test_the_reward_key_picks_a_key_or_an_aggregate_and_keeps_every_key(spec, reward):
    result = outcome(BASE, trial_result({"correctness": 1, "performance": 0.5}), spec)
    assert result.reward == reward and result.rewards == {"correctness": 1.0, "performance": 0.5}
    if reward is None:
        assert result.status == "failure" and "only 'reward' counts" in result.err_message


def test_a_missing_key_of_the_reward_key_is_no_reward_naming_it():
    result = outcome(BASE, trial_result({"correctness": 1}), "mean(correctness, performance)")
    assert result.status == "failure" and "the reward is mean(correctness, performance)" in result.err_message


@pytest.mark.parametrize("spec", ["mean()", "avg(a, b)", "a b", ""])
def test_a_bad_reward_key_is_a_configuration_error_naming_the_field(spec):
    with pytest.raises(ValidationError, match="reward_key: .* is not a key or mean"):
        HarborBackend(tasks_dir=EXAMPLE_TASKS, agent="oracle", reward_key=spec)


def test_a_verifier_error_ends_with_the_verifiers_output(tmp_path):
    from prefect_harbor.trial.outcome import verifier_output_tail

    (tmp_path / "verifier").mkdir()
    assert verifier_output_tail(tmp_path) == "; the verifier printed nothing"
    (tmp_path / "verifier" / "test-stdout.txt").write_text("".join(f"line {n}\n" for n in range(40)) + "ImportError: no module named pytest\n")
    tail = verifier_output_tail(tmp_path)
    assert tail.startswith("; the verifier's output ends:\n") and tail.endswith("ImportError: no module named pytest") and "line 20\n" not in tail


@pytest.mark.parametrize("row", [RowProblem(id="bad", index=0, reason="line 1 is not JSON"), DatasetRow(id="r", metadata={"harbor_task_id": "no-such-task"})])
async def test_an_attempt_names_the_host_that_ran_it_even_when_refused(tmp_path, row):
    """With rows spread over several machines (Dask workers today), a row says which one ran it."""
    import socket

    backend = dataset_backend()
    run = RunContext(run_id="r", trials_dir=tmp_path / "trials")
    result = await run_row(row, 0, "t__1", backend, TaskResolver(backend.sources, tmp_path / "fetched"), run, LOG)
    assert (result.status, result.err_category, result.host) == ("failure", "validation_error", socket.gethostname())
