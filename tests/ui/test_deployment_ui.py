"""A sweep started from the deployment's run form in the real Prefect UI, then its run page."""

import time

import pytest
from deployment_helpers import HTTP, create_flow_run, wait_for_deployment, wait_until
from paths import EXAMPLE_DATASET
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from ui_pages import show

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(600)  # the deadlines below fire first, with what the run was doing
def test_the_run_form_starts_a_sweep_whose_page_shows_rows_and_artifacts(ui_server, served, browser, screenshots, tmp_path):
    """The form starts a sweep and its page shows its task runs and artifacts. Only the pages are under
    test, so the sweep is one row of the examples (the whole set is the demo's and the deployments' tests)."""
    dataset = tmp_path / "one-row.jsonl"
    dataset.write_text(EXAMPLE_DATASET.read_text().splitlines()[0] + "\n")
    deployment = wait_for_deployment(ui_server, "sweep")
    results = str(tmp_path / "from-the-ui")
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    show(page, f"{ui_server}/deployments/deployment/{deployment['id']}/run", "Parameters", screenshots, "deployment-run-form")
    for label in ("dataset", "backend_block (Optional)", "results (Optional)", "storage_block (Optional)", "concurrency (Optional)", "shards (Optional)"):
        assert page.get_by_text(label, exact=True).count() >= 1, f"{label} missing from the run form"
    # shards: a count, or "auto" picked from a list (a one-value const would draw as "cannot be changed").
    page.get_by_role("button", name="Auto", exact=True).click()
    page.locator(".p-select-button__control").last.focus()
    page.keyboard.press("ArrowDown")
    page.locator(".p-select-option").first.wait_for(timeout=10_000)
    assert page.locator(".p-select-option").all_inner_texts() == ["auto"]
    page.screenshot(path=screenshots / "deployment-run-form-shards-auto.png", full_page=True)
    page.reload(wait_until="networkidle")  # the form as it was: shards 1
    page.get_by_text("Parameters").first.wait_for(timeout=30_000)
    # Fields in parameter order: dataset, then backend_block once its "str" option is chosen, then results.
    page.locator("textarea").nth(0).fill(str(dataset))
    page.get_by_role("button", name="str", exact=True).first.click()
    page.locator("textarea").nth(1).fill("deploy-examples")
    page.locator("textarea").nth(2).fill(results)
    page.screenshot(path=screenshots / "deployment-run-form.png", full_page=True)

    def the_run() -> dict | None:
        runs = HTTP.post(f"{ui_server}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment["id"]]}}}, timeout=30).json()
        (run,) = [r for r in runs if r["parameters"].get("results") == results] or [None]
        return run

    for _ in range(3):  # a server whose SQLite a busy neighbour locks answers 503, the form says "Oops": submit again
        page.get_by_role("button", name="Submit").click()
        if any(the_run() or page.wait_for_timeout(1000) for _ in range(30)):
            break
    deadline = time.monotonic() + 420
    while True:
        run = the_run()
        if run and run["state_type"] in ("COMPLETED", "FAILED", "CRASHED"):
            break
        # None: the form created no run; SCHEDULED: the serve process never took it up
        assert time.monotonic() < deadline, f"the run started from the UI did not finish: {run and run['state_type']}"
        time.sleep(1)
    assert run["state_type"] == "COMPLETED"

    show(page, f"{ui_server}/runs/flow-run/{run['id']}", "Completed", screenshots, "flow-run")
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


#: The message Prefect's runner forces on a run it cancelled, replacing the sweep's own (Prefect 3.9).
RUNNERS_MESSAGE = "Flow run was cancelled successfully."


def states_of(base: str, flow_run_id: str) -> list[dict]:
    return sorted(HTTP.get(f"{base}/api/flow_run_states/", params={"flow_run_id": flow_run_id}, timeout=30).json(), key=lambda s: s["timestamp"])


@pytest.mark.timeout(600)  # the deadlines below fire first, with what the run was doing
def test_a_served_sweep_cancelled_in_the_ui_keeps_its_headline(ui_server, served, serve_process, browser, screenshots, tmp_path):
    """Cancel in the UI: the sweep records its rows and ends Cancelled with its headline; the serve process's
    runner then forces its own Cancelled state ("Flow run was cancelled successfully."). The headline must be
    what the run ends with, the cancel no ERROR, and nothing logged after it but the hook that keeps it."""
    from deployment_helpers import save_backend
    from tasks_factory import slow_and_queued

    dataset = slow_and_queued(tmp_path, f"ui-cancel-{tmp_path.name}")  # two slow rows (both lanes), three queued
    save_backend(served, "ui-cancel-slow", tmp_path / "tasks", n_concurrent=2, trials_dir=str(tmp_path / "trials"))
    deployment = wait_for_deployment(ui_server, "sweep")
    parameters = {"dataset": str(dataset), "backend_block": "ui-cancel-slow", "results": str(tmp_path / "results")}
    created = create_flow_run(ui_server, deployment["id"], parameters)
    assert created.status_code == 201, created.text
    run = created.json()

    def where_it_is() -> str:
        state = HTTP.get(f"{ui_server}/api/flow_runs/{run['id']}", timeout=30).json().get("state") or {}
        statuses = [s.read_text()[:400] for s in (tmp_path / "results").glob("*/status.json")]
        return f"flow run: {state.get('type')} {state.get('name')} {state.get('message')!r}; status.json: {statuses}\n{serve_process.log_tail()}"

    # Prewarm first sets the five rows' tasks up (one image, built once per host), beside whatever the other test process runs.
    wait_until(lambda: any('"running": 2' in s.read_text() for s in (tmp_path / "results").glob("*/status.json")), 300, "both slow rows to run", where_it_is)

    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    show(page, f"{ui_server}/runs/flow-run/{run['id']}", "Cancel", screenshots, "running-run", exact=True)  # a page drawn blank is loaded again
    try:
        page.get_by_role("button", name="Cancel", exact=True).first.click(timeout=60_000)
    except PlaywrightTimeoutError:
        page.screenshot(path=screenshots / "cancel-button-missing.png", full_page=True)
        raise AssertionError(f"no Cancel button on the run's page:\n{page.locator('body').inner_text()[:2000]}\n{where_it_is()}") from None
    page.get_by_role("dialog").get_by_role("button", name="Confirm").click()
    # The runner's state comes after the sweep's own; then the sweep's headline must be back, and stay.
    wait_until(lambda: any(s["message"] == RUNNERS_MESSAGE for s in states_of(ui_server, run["id"])), 120, "the runner's Cancelled state")
    final = wait_until(lambda: (s := states_of(ui_server, run["id"])[-1])["message"].startswith("Sweep cancelled") and s, 90, "the headline back")
    time.sleep(5)
    assert states_of(ui_server, run["id"])[-1]["id"] == final["id"], "the headline did not stay"
    assert final["type"] == "CANCELLED" and final["name"] == "0/5 rewarded, 5 cancelled", final
    assert "5 rows: 0 success, 0 failure, 5 cancelled" in final["message"]

    show(page, f"{ui_server}/runs/flow-run/{run['id']}", "0/5 rewarded, 5 cancelled", screenshots, "cancelled-run")
    page.get_by_text("Details", exact=True).first.click()
    page.get_by_text("State Message").first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "cancelled-run-headline.png", full_page=True)
    details = page.locator("body").inner_text()
    assert "Sweep cancelled (" in details and RUNNERS_MESSAGE not in details, details[-1500:]

    page.get_by_text("Logs", exact=True).first.click()
    page.get_by_text("Finished in state 0/5 rewarded, 5 cancelled", exact=False).first.wait_for(timeout=30_000)
    page.screenshot(path=screenshots / "cancelled-run-logs.png", full_page=True)
    logs = page.locator("body").inner_text()
    assert "Downloading flow code" not in logs, "the serve process downloaded the flow's folder after the cancel"
    assert "ERROR" not in logs.split(), "an intended cancel is logged at ERROR"
    page.close()
