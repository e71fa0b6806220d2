"""The block forms in the real Prefect UI, in headless chromium."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deployment_helpers import HTTP
from paths import EXAMPLE_TASKS
from ui_pages import show

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def registered(ui_server):
    env = {**os.environ, "PREFECT_API_URL": f"{ui_server}/api"}
    subprocess.run([str(Path(sys.executable).parent / "prefect"), "block", "register", "-m", "prefect_harbor.blocks"], env=env, check=True, capture_output=True)
    return ui_server


def open_form(page, base: str, slug: str, screenshots: Path) -> None:
    """The block type's create form, rendered."""
    show(page, f"{base}/blocks/catalog/{slug}/create", "Block Name", screenshots, f"block-form-{slug}")


@pytest.mark.parametrize(
    ("slug", "labels"),
    [
        ("harbor-backend", ["Tasks Directory", "Task Mode", "Native Agent Options", "Model", "Max Queue Depth", "Trials at Once", "Allowed Git URL Prefixes"]),
        ("model-endpoint", ["Base URL", "API Key", "Default Model"]),
        ("results-storage", ["Results Root URL", "S3 Endpoint URL", "S3 Secret Access Key"]),
    ],
)
def test_each_block_has_a_usable_form(registered, browser, screenshots, slug, labels):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    open_form(page, registered, slug, screenshots)
    page.screenshot(path=screenshots / f"block-form-{slug}.png", full_page=True)
    for label in labels:
        heading = re.compile(rf"^{re.escape(label)}( \(Optional\))?$")
        assert page.get_by_text(heading).count() >= 1, f"{label!r} missing from the {slug} form"
    page.close()


def open_list(page, label: str):
    """Open the list of the field labelled ``label`` (a click does not open it; the keyboard does); its options."""
    heading = page.locator("label", has_text=re.compile(rf"^\s*{re.escape(label)}( \(Optional\))?\s*$"))
    page.locator(".schema-form-input", has=heading).locator(".p-select-button__control").first.focus()
    page.keyboard.press("ArrowDown")
    options = page.locator(".p-select-option")
    options.first.wait_for(timeout=10_000)
    return options


def choose(page, label: str, option: str) -> None:
    open_list(page, label).filter(has_text=re.compile(rf"^\s*{re.escape(option)}\s*$")).first.click()


def test_the_agent_field_offers_only_the_native_agents_and_finds_no_orcale(registered, browser, screenshots):
    """A typo such as 'orcale' cannot be saved: Agent is a list (the 3.9 form checks no text pattern)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    open_form(page, registered, "harbor-backend", screenshots)
    options = open_list(page, "Agent")
    assert sorted(text.strip() for text in options.all_inner_texts()) == ["None", "mini-swe-agent", "nop", "oracle", "terminus-2"]
    page.locator(".p-combobox__text-input input").last.fill("orcale")
    page.wait_for_timeout(500)
    page.screenshot(path=screenshots / "block-form-agent-orcale.png", full_page=True)
    assert options.count() == 0, f"the Agent list offers {options.all_inner_texts()} for 'orcale'"
    page.close()


def test_a_backend_block_created_in_the_ui_loads_in_python(registered, browser, screenshots):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    # As a user fills it: name, Tasks Directory, Agent; Create (once more if a busy page lost the click).
    create_in_the_form(page, registered, "from-the-ui", EXAMPLE_TASKS / "reward-txt", "oracle", None, screenshots)
    page.screenshot(path=screenshots / "block-created.png", full_page=True)
    page.close()
    code = (
        "from prefect_harbor.blocks import HarborBackend\n"
        "b = HarborBackend.load('from-the-ui')\n"
        "print(b.agent, b.task_mode, b.tasks_dir.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PREFECT_API_URL": f"{registered}/api"}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == ["oracle", "template", "reward-txt"]


#: Blocks the form saves without a word ("Block created successfully"): (tasks dir, agent, workflow agent, what is wrong).
BAD_BLOCKS = {
    "ui-no-agent": (EXAMPLE_TASKS, None, None, "agent: set a native agent, or workflow_agent ('module:Class'), or a bundle= wheel that provides one"),
    "ui-no-tasks-dir": ("/nonexistent/prefect-harbor-tasks", "oracle", None, "tasks_dir: /nonexistent/prefect-harbor-tasks is not a directory"),
    "ui-orcale": (EXAMPLE_TASKS, None, "orcale", "workflow_agent: 'orcale' is not an import path 'module:Class'"),
}


def create_in_the_form(page, base: str, name: str, tasks_dir, agent: str | None, workflow_agent: str | None, screenshots: Path) -> None:
    open_form(page, base, "harbor-backend", screenshots)
    fields = page.locator("input, textarea")  # in schema order: name, Tasks Directory, Workflow Agent (Task Mode and Agent are lists)
    fields.nth(0).fill(name)
    fields.nth(1).fill(str(tasks_dir))
    if agent:
        choose(page, "Agent", agent)
    if workflow_agent:
        fields.nth(2).fill(workflow_agent)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    expect(fields.nth(0)).to_have_value(name)  # the form took what was typed (a cold page can drop early input)
    expect(fields.nth(1)).to_have_value(str(tasks_dir))
    if workflow_agent:
        expect(fields.nth(2)).to_have_value(workflow_agent)
    # A click while the form re-renders (typing into the Workflow Agent union switches it from null to string) can be
    # lost: seen in full runs, never alone. A second click only if the first did not save (the page is still the form).
    for wait_ms in (20_000, 70_000):
        page.get_by_role("button", name="Create").click()
        try:
            page.wait_for_url("**/blocks/block/**", timeout=wait_ms, wait_until="commit")  # saved ("Block created successfully"), and shown
            return
        except PlaywrightTimeout:
            if "/blocks/block/" in page.url:  # saved just as the wait ended
                return
            if "/blocks/catalog/" not in page.url:
                break
    said = page.locator("[role=alert], .p-message, .p-toast").all_inner_texts()
    raise AssertionError(f"the form did not save block {name!r} within 90 s; the page said: {said or page.inner_text('body')[-800:]!r}")


def pick_in_the_run_form(page, base: str, deployment_id: str, dataset: str, block: str, screenshots: Path) -> str:
    """The sweep's run form with ``dataset`` and the Harbor Backend block ``block`` picked in its picker, submitted:
    the name the form gave the run."""
    show(page, f"{base}/deployments/deployment/{deployment_id}/run", "Parameters", screenshots, "sweep-run-form")
    given_name = page.locator("input").first.input_value()  # the form's Run Name, a random one
    page.locator("textarea").nth(0).fill(dataset)
    page.get_by_role("button", name="HarborBackend", exact=True).click()
    from playwright.sync_api import expect

    shows_block = re.compile(rf"^\s*{re.escape(block)}\s*$")
    picker = page.locator(".p-select-button").first  # the block picker (the form's first list), showing the picked block's name
    for _ in range(3):  # a pick while the picker's options still load can be lost (seen in full runs: the run got no backend)
        picker.locator(".p-select-button__control").focus()
        page.keyboard.press("ArrowDown")
        page.locator(".p-select-option").filter(has_text=shows_block).first.click()
        try:
            expect(picker).to_have_text(shows_block, timeout=5_000)
            break
        except AssertionError:
            continue
    expect(picker).to_have_text(shows_block, timeout=1)  # still not picked: say so here, not as a run without a backend
    assert page.locator("textarea").nth(0).input_value() == dataset
    for _ in range(3):  # a server whose SQLite a busy neighbour locks answers 503, the form says "Oops": submit again
        page.get_by_role("button", name="Submit").click()
        for _ in range(30):
            if runs_of_dataset(base, deployment_id, dataset):
                return given_name
            page.wait_for_timeout(1000)
    raise AssertionError("the run form created no run in three tries")


def runs_of_dataset(base: str, deployment_id: str, dataset: str) -> list[dict]:
    every = HTTP.post(f"{base}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}, timeout=30).json()
    return [run for run in every if run["parameters"].get("dataset") == dataset]


def test_a_bad_block_saved_in_the_ui_is_named_by_check_and_through_the_run_forms_picker(registered, served, browser, screenshots, tmp_path):
    """The form saves what the sweep refuses: `check` says what is wrong with each block, and a run whose block was
    picked in the form fails in the same words as one given the block's name, named and tagged after it."""
    from deployment_helpers import BIN, log_messages, wait_for_deployment, wait_until

    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    said = {}
    for name, (tasks_dir, agent, workflow_agent, problem) in BAD_BLOCKS.items():
        create_in_the_form(page, registered, name, tasks_dir, agent, workflow_agent, screenshots)
        check = subprocess.run([str(BIN / "prefect-harbor"), "check", "--backend-block", name], env=served, capture_output=True, text=True, timeout=120)
        assert check.returncode == 2, check.stdout + check.stderr
        said[name] = " ".join(check.stderr.split())
        assert f"backend_block '{name}' is not a valid Harbor Backend block: {problem}" in said[name], said[name]
        assert said[name].endswith("edit it (UI: Blocks) and save it again.")
    page.screenshot(path=screenshots / "bad-block-saved.png", full_page=True)

    deployment = wait_for_deployment(registered, "sweep")
    dataset = str(tmp_path / "picked.jsonl")
    given_name = pick_in_the_run_form(page, registered, deployment["id"], dataset, "ui-no-tasks-dir", screenshots)
    deadline = time.monotonic() + 240
    while (run := runs_of_dataset(registered, deployment["id"], dataset)[0])["state_type"] not in ("FAILED", "COMPLETED", "CRASHED"):
        assert time.monotonic() < deadline, f"the run with the picked block did not finish: {run['name']} {run['state_type']}"
        time.sleep(1)
    message = run["state"]["message"]
    assert run["state_type"] == "FAILED" and "ParameterTypeError" not in message, (message, run["parameters"])
    by_name = said["ui-no-tasks-dir"].split("backend_block ", 1)[1]
    assert message.endswith(f"backend {by_name}"), (message, by_name, run["parameters"])
    # Renamed from the form's random name, as a run given the block's name is; and tagged.
    assert run["name"] != given_name and run["name"].startswith("ui-no-tasks-dir-picked-") and "backend:ui-no-tasks-dir" in run["tags"], (run["name"], run["tags"])

    # A finished run's page reads its logs once: look only when the server has the line (it comes in later on a busy machine).
    wait_until(lambda: any("is not a valid Harbor Backend block" in m for m in log_messages(registered, run["id"])), 240, "the run's log line naming the bad block")
    show(page, f"{registered}/runs/flow-run/{run['id']}", "backend:ui-no-tasks-dir", screenshots, "bad-block-run")  # its name, its tag, and in its log the reason
    page.get_by_text("is not a valid Harbor Backend block").first.wait_for(timeout=60_000)
    page.screenshot(path=screenshots / "bad-block-picked-run.png", full_page=True)
    shown = page.locator("body").inner_text()
    assert run["name"] in shown and f"backend {by_name}" in " ".join(shown.split()), shown[-3000:]
    page.close()
