"""What a sweep with every kind of row looks like in the real Prefect UI: its run in the run list, its
task runs' badges, a row's own log, and the row table (published while it runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deployment_helpers import HTTP, api_env, log_messages, wait_until
from tasks_factory import write_task
from ui_pages import show

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLI = str(Path(sys.executable).parent / "prefect-harbor")
#: Each row's expected (status, task-run state type, the state's name: its badge in the task-run list).
EXPECTED = {
    "scored-1": ("success", "COMPLETED", "Reward 1"),
    "zero-1": ("success", "COMPLETED", "Reward 0"),
    "missing-1": ("failure", "FAILED", "Validation error"),
    "slow-1": ("cancelled", "CANCELLED", "Cancelled"),
}
#: What the zero-scored row's verifier prints before writing its 0: its task run's log must end with it.
VERIFIER_SAYS = "FAILED: expected 42, got 41"
#: The flow run's final state's name: the counts, in the run list's badge.
COUNTS = "1/4 rewarded, 1 failed, 1 cancelled, mean 0.5"


def mixed_dataset(tmp_path: Path, marker: str) -> tuple[Path, Path]:
    """Four rows: one scored 1.0, one scored 0.0, one whose task does not exist, one slow (to be cancelled)."""
    tasks = tmp_path / "tasks"
    write_task(tasks, "scored")
    write_task(tasks, "zero", test=f"echo 'checking the answer'; echo '{VERIFIER_SAYS}'; echo 0 > /logs/verifier/reward.txt")
    write_task(tasks, "slow", solve=f"bash -c 'sleep 600 & wait' {marker}")
    dataset = tmp_path / "rows.jsonl"
    rows = [("slow-1", "slow"), ("scored-1", "scored"), ("zero-1", "zero"), ("missing-1", "no-such-task")]
    dataset.write_text("".join(json.dumps({"id": i, "metadata": {"harbor_task_id": t}}) + "\n" for i, t in rows))
    return tasks, dataset


def only_slow_row_running(results: Path) -> Path | None:
    """The run folder once every row but slow-1 has finished, slow-1 still running."""
    for status in results.glob("*/status.json"):
        try:
            rows = json.loads(status.read_text()).get("rows", {})
        except (OSError, ValueError):  # written atomically, but the folder may be mid-creation
            continue
        if rows.get("slow-1") == "running" and all(rows.get(row) == expected for row, (expected, *_) in EXPECTED.items() if row != "slow-1"):
            return status.parent
    return None


def artifacts_of(base: str, flow_run_id: str, key: str) -> list[dict]:
    """The flow run's versions of the artifact ``key``, newest first."""
    query = {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": [key]}}, "sort": "CREATED_DESC"}
    return HTTP.post(f"{base}/api/artifacts/filter", json=query).json()


def sweep_of(base: str, dataset: Path) -> dict:
    (flow_run,) = [run for run in HTTP.post(f"{base}/api/flow_runs/filter", json={}).json() if run["parameters"].get("dataset") == str(dataset)]
    return flow_run


def test_a_mixed_sweep_shows_each_rows_outcome_the_headline_and_the_row_table(ui_server, browser, screenshots, tmp_path):
    marker = f"ui-mixed-{os.getpid()}"
    tasks, dataset = mixed_dataset(tmp_path, marker)
    results = tmp_path / "results"
    env = api_env(ui_server, tmp_path)
    sweep = subprocess.Popen(
        [CLI, "sweep", "--tasks-dir", str(tasks), "--dataset", str(dataset), "--results", str(results), "--concurrency", "4", "--no-prewarm"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    try:
        run_folder = wait_until(lambda: only_slow_row_running(results), 180, "the other rows to finish while the slow one runs")
        # While the sweep runs, its row table is already there, with the finished rows and their archives.
        running = sweep_of(ui_server, dataset)
        live, *_ = wait_until(lambda: artifacts_of(ui_server, running["id"], "evaluation-sweep-rows"), 180, "the row table while the sweep runs")
        show(page, f"{ui_server}/artifacts/artifact/{live['id']}", "missing-1", screenshots, "mixed-run-row-table-while-running")
        page.screenshot(path=screenshots / "mixed-run-row-table-while-running.png", full_page=True)
        assert running["state_type"] == "RUNNING" and "archive" in page.locator("table").first.inner_text()
        assert live["task_run_id"] is None, "the row table is the flow run's, not the task run of the row that finished last"
        cancel = subprocess.run([CLI, "cancel", str(run_folder), "slow-1", "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert json.loads(cancel.stdout) == {"slow-1": "cancelled_running"}, cancel.stderr
        output, _ = sweep.communicate(timeout=180)
    finally:
        sweep.kill()
    assert sweep.returncode == 0, output[-3000:]  # the sweep ran: its rows' outcomes are in its results

    flow_run = sweep_of(ui_server, dataset)
    headline = flow_run["state"]["message"]
    assert (flow_run["state_type"], flow_run["state"]["name"]) == ("COMPLETED", COUNTS)
    assert headline.startswith("4 rows: 2 success, 1 failure, 1 cancelled; mean reward 0.5"), headline
    task_runs = HTTP.post(f"{ui_server}/api/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run["id"]]}}}).json()
    task_runs = {run["name"].removeprefix("row "): run for run in task_runs if run["name"].startswith("row ")}
    assert {row: (run["state"]["type"], run["state"]["name"]) for row, run in task_runs.items()} == {row: tuple(rest) for row, (_, *rest) in EXPECTED.items()}

    logs = log_messages(ui_server, flow_run["id"])
    assert not [m for m in logs if m.startswith("Task run failed with state") or "NoneType: None" in m], "a returned Failed state is logged twice"

    # 1. The run list shows the sweep's counts; the task-run list, each row's outcome in its badge.
    show(page, f"{ui_server}/runs", flow_run["name"], screenshots, "mixed-run-in-the-run-list")
    page.screenshot(path=screenshots / "mixed-run-in-the-run-list.png", full_page=True)
    badge = page.locator(".flow-run-list-item", has_text=flow_run["name"]).first.locator(".state-badge").first
    assert badge.inner_text().strip() == COUNTS
    show(page, f"{ui_server}/runs/flow-run/{flow_run['id']}", "Task Runs", screenshots, "mixed-run", exact=True)
    page.get_by_text("Task Runs", exact=True).first.click()
    for row in EXPECTED:
        page.get_by_text(f"row {row}", exact=True).first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "mixed-run-task-runs.png", full_page=True)
    for row, (_, _, badge) in EXPECTED.items():
        item = page.locator(".task-run-list-item", has_text=f"row {row}").first
        assert item.locator(".state-badge").first.inner_text().strip() == badge, item.inner_text()

    # 4. A row's own log: its timings, its archive and, as it scored 0, what its verifier said last.
    show(page, f"{ui_server}/runs/task-run/{task_runs['zero-1']['id']}", VERIFIER_SAYS, screenshots, "mixed-run-zero-row-log")
    page.screenshot(path=screenshots / "mixed-run-zero-row-log.png", full_page=True)
    shown = page.locator("body").inner_text()
    archive = next(row["artifact_uri"] for row in pq.read_table(next(results.glob("*/results.parquet"))).to_pylist() if row["row_id"] == "zero-1")
    assert "Row zero-1 (zero): success, reward 0;" in shown and " s, total " in shown
    assert f"archive {archive}" in shown
    assert "checking the answer" in shown

    show(page, f"{ui_server}/runs/flow-run/{flow_run['id']}", "Artifacts", screenshots, "mixed-run", exact=True)
    page.get_by_text("Artifacts", exact=True).first.click()
    page.get_by_text("evaluation-sweep-rows").first.wait_for(timeout=30_000)
    # One table, updated in place: the artifact the page showed while the sweep ran is the final one.
    (final,) = artifacts_of(ui_server, flow_run["id"], "evaluation-sweep-rows")
    assert final["id"] == live["id"] and "so far" not in final["description"], final["description"]
    show(page, f"{ui_server}/artifacts/artifact/{final['id']}", "missing-1", screenshots, "mixed-run-row-table")
    page.screenshot(path=screenshots / "mixed-run-row-table.png", full_page=True)
    table = page.locator("table").first.inner_text()
    for row, (status, *_) in EXPECTED.items():
        assert row in table and status in table, f"{row} ({status}) missing from the row table"
    assert "no-such-task" in table, "the failed row's task is not named"
    missing = next(row["artifact_uri"] for row in pq.read_table(next(results.glob("*/results.parquet"))).to_pylist() if row["row_id"] == "missing-1")
    assert "archive" in table and missing.rsplit("/", 1)[-1] in table, "the row table names each row's archive"

    show(page, f"{ui_server}/runs/flow-run/{flow_run['id']}", "Logs", screenshots, "mixed-run", exact=True)
    page.get_by_text("Logs", exact=True).first.click()
    page.get_by_text(headline[:40]).first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "mixed-run-headline.png", full_page=True)
    page.close()
