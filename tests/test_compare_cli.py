"""``prefect-harbor compare``'s exit codes and refusals, on run folders written by the run store (no sweep needed)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefect_harbor.cli.commands import app
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore


def run_folder(root: Path, run_id: str, rewards: dict[str, float | None]) -> Path:
    """A run folder whose results hold one attempt per row, ``None`` being a failed row."""
    store = RunStore(str(root), run_id, fallback_dir=root / "fallback")
    rows = [
        RowResult(row_index=index, row_id=row_id, task=row_id.split("-")[0], agent="oracle", status="failure" if reward is None else "success", reward=reward)
        for index, (row_id, reward) in enumerate(rewards.items())
    ]  # fmt: skip
    store.write_rows(rows)
    store.compact()
    return root / run_id


def compare(*args: str):
    return CliRunner().invoke(app, ["compare", *args])


def test_a_worse_run_exits_0_unless_fail_if_worse_is_given(tmp_path):
    before = run_folder(tmp_path, "a", {"t-1": 1.0, "t-2": 1.0, "u-1": 1.0})
    after = run_folder(tmp_path, "b", {"t-1": 0.0, "t-2": 1.0, "u-1": 1.0})
    answer = compare(str(before), str(after), "--json")
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.output)["difference"]["difference"]["mean"] == -1 / 3
    assert compare(str(before), str(after), "--fail-if-worse", "0.3").exit_code == 1
    assert compare(str(before), str(after), "--fail-if-worse", "0.4").exit_code == 0


def test_a_folder_without_results_is_refused_naming_it(tmp_path):
    before = run_folder(tmp_path, "a", {"t-1": 1.0})
    (tmp_path / "empty").mkdir()
    answer = compare(str(before), str(tmp_path / "empty"))
    assert answer.exit_code != 0 and "holds no results" in answer.output and "empty" in answer.output


def test_fail_if_worse_on_runs_with_no_row_scored_in_both_says_so(tmp_path):
    before = run_folder(tmp_path, "a", {"t-1": 1.0, "t-2": 0.0})
    after = run_folder(tmp_path, "b", {"other-1": 1.0, "other-2": 1.0})
    assert compare(str(before), str(after)).exit_code == 0, "without --fail-if-worse, any result exits 0"
    answer = compare(str(before), str(after), "--fail-if-worse", "0")
    assert answer.exit_code != 0 and "no row was scored in both runs" in answer.output
