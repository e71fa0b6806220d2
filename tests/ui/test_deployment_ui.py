"""A sweep started from the deployment's run form in the real Prefect UI, then its run page."""

import time

import httpx
import pytest

from deployment_helpers import wait_for_deployment
from paths import EXAMPLE_DATASET

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_the_run_form_starts_a_sweep_whose_page_shows_rows_and_artifacts(ui_server, served, browser, screenshots, tmp_path):
    deployment = wait_for_deployment(ui_server, "sweep")
    results = str(tmp_path / "from-the-ui")
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(f"{ui_server}/deployments/deployment/{deployment['id']}/run", wait_until="networkidle")
    page.get_by_text("Parameters").first.wait_for(timeout=30_000)
    for label in ("dataset", "backend_block (Optional)", "results (Optional)", "storage_block (Optional)", "concurrency (Optional)"):
        assert page.get_by_text(label, exact=True).count() >= 1, f"{label} missing from the run form"
    # Fields in parameter order: dataset, then backend_block once its "str" option is chosen, then results.
    page.locator("textarea").nth(0).fill(str(EXAMPLE_DATASET))
    page.get_by_role("button", name="str", exact=True).first.click()
    page.locator("textarea").nth(1).fill("deploy-examples")
    page.locator("textarea").nth(2).fill(results)
    page.screenshot(path=screenshots / "deployment-run-form.png", full_page=True)
    page.get_by_role("button", name="Submit").click()

    deadline = time.monotonic() + 180
    while True:
        runs = httpx.post(f"{ui_server}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment["id"]]}}}).json()
        (run,) = [r for r in runs if r["parameters"].get("results") == results] or [None]
        if run and run["state_type"] in ("COMPLETED", "FAILED", "CRASHED"):
            break
        # None: the form created no run; SCHEDULED: the serve process never took it up
        assert time.monotonic() < deadline, f"the run started from the UI did not finish: {run and run['state_type']}"
        time.sleep(1)
    assert run["state_type"] == "COMPLETED"

    page.goto(f"{ui_server}/runs/flow-run/{run['id']}", wait_until="networkidle")
    page.get_by_text("Completed").first.wait_for(timeout=30_000)
    page.get_by_text("Task Runs", exact=True).first.click()
    page.get_by_text("row multi-key-reward-1").first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "flow-run-task-runs.png", full_page=True)
    page.get_by_text("Artifacts", exact=True).first.click()
    page.get_by_text("evaluation-sweep-summary").first.wait_for(timeout=30_000)
    text = page.locator("body").inner_text()
    for key in ("evaluation-sweep-summary", "evaluation-sweep-report", "evaluation-sweep-progress", "evaluation-sweep-results"):
        assert key in text, f"artifact {key} not shown on the run page"
    page.screenshot(path=screenshots / "flow-run-artifacts.png", full_page=True)
    page.close()
