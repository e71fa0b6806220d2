"""Which attempts of an earlier run ``rerun_failed`` runs again: by the scoring contract, never a scored one."""

from __future__ import annotations

from pathlib import Path

import pytest
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS
from typer.testing import CliRunner

from prefect_harbor.cli.commands import app
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.selection import rerun_choice
from prefect_harbor.rows.attempts import RERUN_ALONE
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore

SANDBOX_FAILED = {"status": "failure", "reward": None, "err_category": "agent_error", "failure_cause": "sandbox_failed"}
VERIFIER_FAILED = {"status": "failure", "reward": None, "err_category": "verifier_error", "err_phase": "verifier", "verifier_mode": "separate"}
AGENT_TIMEOUT = {"status": "failure", "reward": None, "err_category": "timeout", "err_phase": "agent"}
SCORED_ZERO = {"status": "success", "reward": 0.0}
CANCELLED = {"status": "cancelled", "reward": None, "err_message": "cancelled while running"}


def earlier_run(root: Path, attempts: dict[tuple[str, int], dict]) -> RunStore:
    store = RunStore(str(root), "earlier", fallback_dir=root / "fallback")
    ids = list(dict.fromkeys(row_id for row_id, _ in attempts))
    store.write_rows(
        [RowResult(row_index=ids.index(row_id), row_id=row_id, attempt=attempt, task="t", agent="oracle", **fields) for (row_id, attempt), fields in attempts.items()]
    )
    store.compact()
    return RunStore.open(str(root / "earlier"), None)


def test_by_default_only_attempts_that_measured_nothing_run_again(tmp_path):
    store = earlier_run(
        tmp_path,
        {("a", 1): SCORED_ZERO, ("a", 2): SANDBOX_FAILED, ("b", 1): AGENT_TIMEOUT, ("b", 2): CANCELLED, ("c", 1): VERIFIER_FAILED, ("d", 1): SCORED_ZERO},
    )
    choice = rerun_choice(store)
    assert choice.in_dataset_order(["d", "c", "b", "a"]) == {"c": [1], "b": [2], "a": [2]}, "scored (even 0) and agent failures stay"
    assert choice.describe() == "3 attempts (2 not scored, 1 cancelled; 1 agent failures and 2 scored kept)"


def test_agent_failures_run_again_only_when_asked(tmp_path):
    store = earlier_run(tmp_path, {("a", 1): AGENT_TIMEOUT, ("a", 2): SCORED_ZERO, ("b", 1): CANCELLED})
    choice = rerun_choice(store, agent_failures=True)
    assert choice.in_dataset_order(["a", "b"]) == {"a": [1], "b": [1]}
    assert choice.describe() == "2 attempts (1 cancelled, 1 agent failures; 1 scored kept)"


def test_a_run_with_only_scored_attempts_and_agent_failures_says_how_to_rerun_the_failures(tmp_path):
    store = earlier_run(tmp_path, {("a", 1): AGENT_TIMEOUT, ("b", 1): SCORED_ZERO})
    with pytest.raises(ConfigurationError, match=r"none not scored or cancelled; its 1 agent failures run again with rerun_agent_failures \(--rerun-agent-failures\)"):
        rerun_choice(store)


def test_rerun_agent_failures_without_a_run_to_rerun_is_refused_before_anything_starts(tmp_path):
    result = CliRunner().invoke(
        app, ["sweep", "--tasks-dir", str(EXAMPLE_TASKS), "--dataset", str(EXAMPLE_DATASET), "--rerun-agent-failures", "--results", str(tmp_path / "r")]
    )
    assert result.exit_code == 2
    assert RERUN_ALONE in result.output
    assert not (tmp_path / "r").exists()
