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


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--tasks-dir", "/no/such/dir", "--dataset", str(EXAMPLE_DATASET)], "tasks_dir: /no/such/dir is not a directory"),
        (["--tasks-dir", str(EXAMPLE_TASKS), "--dataset", "/no/such.jsonl"], "cannot open dataset /no/such.jsonl"),
        (["--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET), "--agent", "nope"], "unknown native agent 'nope'"),
    ],
)
def test_configuration_errors_exit_non_zero_with_one_line(args, reason, tmp_path):
    result = run_cli("sweep", *args, "--results", str(tmp_path / "r"))
    assert result.returncode == 2
    assert reason in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "r").exists(), "nothing may start before the configuration is valid"


@pytest.mark.integration
def test_sweep_json_reports_a_readable_results_uri(tmp_path):
    result = run_cli(
        "sweep", "--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET),
        "--results", str(tmp_path / "results"), "--concurrency", "2", "--json",
        env={"TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    table = pq.read_table(summary["results_uri"])
    assert {"row_id", "task", "status", "reward", "rewards", "err_category", "err_message", "agent_sec"} <= set(table.column_names)
    assert table.schema.field("row_id").type == "string" and table.schema.field("reward").type == "double"
    assert {r["task"]: r["reward"] for r in table.to_pylist()} == EXPECTED_ORACLE_REWARDS
