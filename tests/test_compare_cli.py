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


def test_the_sweeps_table_prints_the_interval_pass_at_k_and_tokens_per_task_and_overall():
    from rich.console import Console

    from prefect_harbor.cli.compare import statistics_table
    from prefect_harbor.outcome import figure
    from prefect_harbor.stats.summary import summarize

    rewards = {"p": (1.0, 1.0, 1.0), "z": (0.0, 0.0, 0.0), "f": (1.0, 0.0, 1.0)}
    records = [
        {"row_id": row, "attempt": n + 1, "task": "zeros" if row == "z" else "ones", "status": "success", "reward": reward,
         "input_tokens": 100, "cached_tokens": 10, "output_tokens": 5, "cost_usd": 0.001}
        for row, values in rewards.items() for n, reward in enumerate(values)
    ]  # fmt: skip
    statistics = summarize(records)
    console = Console(width=200, record=True)
    console.print(statistics_table(statistics, "Figures"))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "95% CI" in line)
    assert [word for word in ("trials", "pass@1", "pass@3", "tokens, cost") if word in header] == ["trials", "pass@1", "pass@3", "tokens, cost"]
    cells = {cells[0]: cells[1:] for line in lines if "│" in line for cells in [[cell.strip() for cell in line.strip("│").split("│")]]}
    low, high = statistics.reward.ci95
    assert cells["(all)"] == [
        "3", "9", figure(5 / 9), f"{figure(low)} to {figure(high)}", figure(statistics.pass_at_k[1]), figure(2 / 3),
        "900 input (90 cached), 45 output tokens; $0.009",
    ]  # fmt: skip
    assert cells["ones"][:2] == ["2", "6"] and cells["ones"][4:6] == [figure(5 / 6), "1"], "per task: rows, trials, pass@1, pass@3"

    single = Console(width=200, record=True)
    single.print(statistics_table(summarize([{**r, "attempt": 1} for r in records if r["attempt"] == 1]), "One attempt"))
    header = next(line for line in single.export_text().splitlines() if "95% CI" in line)
    assert "pass@" not in header and "trials" not in header, "one attempt per row: no pass@k or trials columns"


def test_the_sweeps_summary_names_flagged_verifier_output_even_without_token_usage(capsys):
    from prefect_harbor.cli.commands import print_summary
    from prefect_harbor.stats.summary import summarize
    from prefect_harbor.storage.results import SweepSummary, TaskScore

    statistics = summarize([{"row_id": "a", "task": "t", "status": "success", "reward": 1.0, "verifier_tampering": "reward.txt rewritten"}])
    summary = SweepSummary(
        run_id="r", results_uri="file:///r/results.parquet", rows=1, success=1, failure=0, cancelled=0, mean_reward=1.0,
        per_task={"t": TaskScore(rows=1, mean_reward=1.0)}, statistics=statistics,
    )  # fmt: skip
    print_summary(summary)
    assert "1 attempt(s) had their verifier output flagged as tampered with" in capsys.readouterr().out


def test_fail_on_regression_exits_1_only_for_a_drop_beyond_chance(tmp_path):
    """The issue's case: one task went from 8/8 to 0/8, a coin-flip task's two rows went 1 -> 0."""
    always = {f"always-{i}": 1.0 for i in range(8)}
    before = run_folder(tmp_path, "a", always | {"coin-1": 1.0, "coin-2": 1.0})
    after = run_folder(tmp_path, "b", dict.fromkeys(always, 0.0) | {"coin-1": 0.0, "coin-2": 0.0})
    answer = compare(str(before), str(after), "--fail-on-regression")
    assert answer.exit_code == 1 and "regressed beyond chance: overall, always" in answer.output, answer.output
    coin_only = run_folder(tmp_path, "c", always | {"coin-1": 0.0, "coin-2": 0.0})
    answer = compare(str(before), str(coin_only), "--fail-on-regression")
    assert answer.exit_code == 0, "two rows 1 -> 0 could be chance (McNemar p = 0.5)"
    assert "could be chance" in answer.output and "no clear change" in answer.output


def test_the_baseline_is_named_by_run_name_and_id_and_different_datasets_are_said(tmp_path):
    from datetime import UTC, datetime

    from prefect_harbor.storage.manifest import RunManifest

    folders = {"a": {"t-1": 1.0, "t-2": 1.0, "gone-1": 1.0}, "b": {"t-1": 1.0, "t-2": 0.0, "new-1": 1.0}}
    for run_id, rewards in folders.items():
        run_folder(tmp_path, run_id, rewards)
        RunStore(str(tmp_path), run_id, fallback_dir=tmp_path / "fallback").write_manifest(
            RunManifest(run_id=run_id, flow_run_name=f"oracle-{run_id}", state="Completed", started_at=datetime(2026, 12, 1, tzinfo=UTC),
                        dataset={"fingerprint": f"rows-of-{run_id}", "rows": 3}, configuration={}, versions={})  # fmt: skip
        )
    answer = compare(str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    comparison = json.loads(answer.stdout)
    assert (comparison["baseline_run_id"], comparison["baseline_run_name"], comparison["different_datasets"]) == ("a", "oracle-a", True)
    assert "note: the runs are of different datasets: only rows with the same id are paired" in answer.stderr
    assert "note: 1 row only in the baseline and 1 only in the candidate: left out of every difference" in answer.stderr
    answer = compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert "1 task lower than run 'oracle-a' (a) of 2026-12-01: t −0.5" in " ".join(answer.stdout.split()), answer.stdout
    assert "(different datasets)" in answer.stdout
