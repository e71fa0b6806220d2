"""What a finished sweep with every kind of row looks like on its flow-run page, in the real Prefect UI."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deployment_helpers import api_env
from tasks_factory import write_task

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLI = str(Path(sys.executable).parent / "prefect-harbor")
#: Each row's expected (status, task-run state).
EXPECTED = {
    "scored-1": ("success", "Completed"),
    "zero-1": ("success", "Completed"),
    "missing-1": ("failure", "Failed"),
    "slow-1": ("cancelled", "Cancelled"),
}


def mixed_dataset(tmp_path: Path, marker: str) -> tuple[Path, Path]:
    """Four rows: one scored 1.0, one scored 0.0, one whose task does not exist, one slow (to be cancelled)."""
    tasks = tmp_path / "tasks"
    write_task(tasks, "scored")
    write_task(tasks, "zero", test="echo 0 > /logs/verifier/reward.txt")
    write_task(tasks, "slow", solve=f"bash -c 'sleep 600 & wait' {marker}")
    dataset = tmp_path / "rows.jsonl"
    rows = [("slow-1", "slow"), ("scored-1", "scored"), ("zero-1", "zero"), ("missing-1", "no-such-task")]
    dataset.write_text("".join(json.dumps({"id": i, "metadata": {"harbor_task_id": t}}) + "\n" for i, t in rows))
    return tasks, dataset


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return value


def slow_row_running(results: Path) -> Path | None:
    for status in results.glob("*/status.json"):
        try:
            if json.loads(status.read_text()).get("rows", {}).get("slow-1") == "running":
                return status.parent
        except (OSError, ValueError):  # written atomically, but the folder may be mid-creation
            pass
    return None


def test_a_mixed_sweep_shows_each_rows_outcome_the_headline_and_the_row_table(ui_server, browser, screenshots, tmp_path):
    marker = f"ui-mixed-{os.getpid()}"
    tasks, dataset = mixed_dataset(tmp_path, marker)
    results = tmp_path / "results"
    env = api_env(ui_server, tmp_path)
    sweep = subprocess.Popen(
        [CLI, "sweep", "--tasks-dir", str(tasks), "--dataset", str(dataset), "--results", str(results), "--concurrency", "4", "--no-prewarm"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        run_folder = wait_until(lambda: slow_row_running(results), 180, "the slow row to run")
        cancel = subprocess.run([CLI, "cancel", str(run_folder), "slow-1", "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert json.loads(cancel.stdout) == {"slow-1": "cancelled_running"}, cancel.stderr
        output, _ = sweep.communicate(timeout=180)
    finally:
        sweep.kill()
    assert sweep.returncode == 0, output[-3000:]  # the sweep ran: its rows' outcomes are in its results

    (flow_run,) = [run for run in httpx.post(f"{ui_server}/api/flow_runs/filter", json={}).json() if run["parameters"].get("dataset") == str(dataset)]
    headline = flow_run["state"]["message"]
    assert flow_run["state_type"] == "COMPLETED"
    assert headline.startswith("4 rows: 2 success, 1 failure, 1 cancelled; mean reward 0.5"), headline
    task_runs = httpx.post(f"{ui_server}/api/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run["id"]]}}}).json()
    states = {run["name"].removeprefix("row "): run["state"]["name"] for run in task_runs if run["name"].startswith("row ")}
    assert states == {row: state for row, (_, state) in EXPECTED.items()}

    logs = [log["message"] for log in httpx.post(f"{ui_server}/api/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run["id"]]}}}).json()]
    assert not [m for m in logs if m.startswith("Task run failed with state") or "NoneType: None" in m], "a returned Failed state is logged twice"

    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(f"{ui_server}/runs/flow-run/{flow_run['id']}", wait_until="networkidle")
    page.get_by_text("Task Runs", exact=True).first.click()
    for row in EXPECTED:
        page.get_by_text(f"row {row}", exact=True).first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "mixed-run-task-runs.png", full_page=True)
    shown = page.locator("body").inner_text()
    for state in ("Completed", "Failed", "Cancelled"):
        assert state in shown, f"no {state} task run on the page"

    page.get_by_text("Artifacts", exact=True).first.click()
    page.get_by_text("evaluation-sweep-rows").first.click()
    page.get_by_text("missing-1").first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "mixed-run-row-table.png", full_page=True)
    table = page.locator("body").inner_text()
    for row, (status, _) in EXPECTED.items():
        assert row in table and status in table, f"{row} ({status}) missing from the row table"
    assert "no-such-task" in table, "the failed row's task is not named"

    page.goto(f"{ui_server}/runs/flow-run/{flow_run['id']}", wait_until="networkidle")
    page.get_by_text("Logs", exact=True).first.click()
    page.get_by_text(headline[:40]).first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "mixed-run-headline.png", full_page=True)
    page.close()
