"""The block forms in the real Prefect UI, in headless chromium."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paths import EXAMPLE_TASKS

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def registered(ui_server):
    env = {**os.environ, "PREFECT_API_URL": f"{ui_server}/api"}
    subprocess.run([str(Path(sys.executable).parent / "prefect"), "block", "register", "-m", "prefect_harbor.blocks"], env=env, check=True, capture_output=True)
    return ui_server


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
    page.goto(f"{registered}/blocks/catalog/{slug}/create", wait_until="networkidle")
    page.get_by_text("Block Name").first.wait_for(timeout=30_000)
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
    page.goto(f"{registered}/blocks/catalog/harbor-backend/create", wait_until="networkidle")
    page.get_by_text("Block Name").first.wait_for(timeout=30_000)
    options = open_list(page, "Agent")
    assert sorted(text.strip() for text in options.all_inner_texts()) == ["None", "mini-swe-agent", "oracle", "terminus-2"]
    page.locator(".p-combobox__text-input input").last.fill("orcale")
    page.wait_for_timeout(500)
    page.screenshot(path=screenshots / "block-form-agent-orcale.png", full_page=True)
    assert options.count() == 0, f"the Agent list offers {options.all_inner_texts()} for 'orcale'"
    page.close()


def test_a_backend_block_created_in_the_ui_loads_in_python(registered, browser, screenshots):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(f"{registered}/blocks/catalog/harbor-backend/create", wait_until="networkidle")
    page.get_by_text("Block Name").first.wait_for(timeout=30_000)
    # The form's text fields carry no labels a locator can use; they come in schema order:
    # block name, tasks_dir, ... (Task Mode and Agent are lists).
    fields = page.locator("input, textarea")
    fields.nth(0).fill("from-the-ui")
    fields.nth(1).fill(str(EXAMPLE_TASKS / "reward-txt"))
    choose(page, "Agent", "oracle")
    page.get_by_role("button", name="Create").click()
    page.wait_for_url("**/blocks/block/**", timeout=30_000)
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
