"""The CLI contract: exit codes, one-line configuration errors, --json with results_uri."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS, EXPECTED_ORACLE_REWARDS

CLI = str(Path(sys.executable).parent / "prefect-harbor")
DATASET = ["--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET)]


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--tasks-dir", "/no/such/dir", "--dataset", str(EXAMPLE_DATASET)], "tasks_dir: /no/such/dir is not a directory"),
        (["--tasks-dir", str(EXAMPLE_TASKS), "--dataset", "/no/such.jsonl"], "cannot open dataset /no/such.jsonl"),
        (["--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET), "--agent", "nope"], "unknown native agent 'nope'"),
        # The workflow track's and the model endpoint's forbidden combinations (Osmosis's rules).
        ([*DATASET, "--agent", "terminus-2"], "model_endpoint: terminus-2 needs a model endpoint"),
        ([*DATASET, "--model-api-key-env", "SOME_KEY"], "--model-api-key-env: names the key for --model-base-url"),
        ([*DATASET, "--model-endpoint", "x", "--model-base-url", "http://127.0.0.1:9/v1"], "--model-endpoint: a saved block replaces"),
        ([*DATASET, "--agent", "terminus-2", "--model-base-url", "http://127.0.0.1:9/v1", "--model-api-key-env", "UNSET_KEY_VAR"],
         "the environment variable UNSET_KEY_VAR is not set"),
        ([*DATASET, "--model-base-url", "ftp://host/v1"], "is not an http(s) URL"),
        ([*DATASET, "--workflow-config", "pkg.config:cfg"], "workflow_config: configures an AgentWorkflow agent"),
        ([*DATASET, "--grader-config", "pkg.config:cfg"], "grader_config: configures a grader"),
        ([*DATASET, "--agent", "pkg.mod:Workflow", "--code-dir", "/tmp", "--bundle", "/tmp/x.whl"], "bundle: a prebuilt wheel replaces building code_dir"),
        ([*DATASET, "--code-dir", "/tmp"], "code_dir: only used to build a workflow bundle"),
        ([*DATASET, "--backend-block", "b", "--model", "m"], "--backend-block: the saved block holds the whole configuration; drop --model"),
        ([*DATASET, "--agent", "no_such_pkg.workflow:Workflow"], "cannot locate package 'no_such_pkg'"),
    ],
)
def test_configuration_errors_exit_non_zero_with_one_line(args, reason, tmp_path):
    result = run_cli("sweep", *args, "--results", str(tmp_path / "r"))
    assert result.returncode == 2
    assert reason in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "r").exists(), "nothing may start before the configuration is valid"


def test_check_lists_tasks_with_their_reward_source_and_finds_v02_apis(tmp_path):
    (tmp_path / "rollout.py").write_text("backend = HarborBackendV2(task_dir='t')\n")
    result = run_cli("check", "--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET), "--code-dir", str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert "configuration OK" in result.stdout
    for task in EXPECTED_ORACLE_REWARDS:
        assert task in result.stdout
    assert "tests/test.sh" in result.stdout
    assert f"{tmp_path / 'rollout.py'}:1:" in result.stdout
    assert "2 use(s) of removed v0.2 APIs" in result.stdout


def test_check_passes_a_clean_configuration():
    result = run_cli("check", "--tasks-dir", str(EXAMPLE_TASKS / "reward-txt"), "--mode", "template")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reward-txt" in result.stdout and "tests/test.sh" in result.stdout


@pytest.mark.integration
def test_sweep_json_reports_a_readable_results_uri(tmp_path, prefect_server):
    from prefect.settings import get_current_settings

    result = run_cli(
        "sweep", "--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET),
        "--results", str(tmp_path / "results"), "--concurrency", "2", "--rows-per-task-run", "2", "--json",
        env={"TMPDIR": str(tmp_path), "PREFECT_API_URL": str(get_current_settings().api.url)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    table = pq.read_table(summary["results_uri"])
    assert {"row_id", "task", "status", "reward", "rewards", "err_category", "err_message", "agent_sec"} <= set(table.column_names)
    assert table.schema.field("row_id").type == "string" and table.schema.field("reward").type == "double"
    assert {r["task"]: r["reward"] for r in table.to_pylist()} == EXPECTED_ORACLE_REWARDS


#: Runs `prefect-harbor sweep` with the temporary server replaced by a probe that prints the
#: startup timeout Prefect would use (its settings are read once, when prefect is imported).
PROBE_SERVER_TIMEOUT = """
import contextlib, sys
from prefect_harbor.cli import commands

@contextlib.contextmanager
def probe():
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
    print("startup timeout", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    raise SystemExit(0)
    yield

commands.temporary_server = probe
commands.app(["sweep", *sys.argv[1:]])
"""


@pytest.mark.parametrize(("setting", "seen"), [(None, "120"), ("45", "45")])
def test_the_cli_gives_prefects_temporary_server_a_generous_startup_timeout_unless_the_user_set_one(setting, seen):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")}
    if setting:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = setting
    probe = subprocess.run([sys.executable, "-c", PROBE_SERVER_TIMEOUT, *DATASET], capture_output=True, text=True, timeout=120, env=env)
    assert f"startup timeout {seen}" in probe.stdout, probe.stdout + probe.stderr


def test_a_temporary_server_that_does_not_start_in_time_says_what_to_do_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    result = subprocess.run(
        [CLI, "sweep", *DATASET, "--results", str(tmp_path / "r")], capture_output=True, text=True, timeout=300,
        env={**env, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"},  # no server answers within 1 s
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "did not start within 1 s" in line and "PREFECT_API_URL" in line and "raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in line
