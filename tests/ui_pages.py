"""Pages of the real Prefect UI, loaded as a user would load them."""

from pathlib import Path
from urllib.parse import urlsplit

import httpx
from deployment_helpers import HTTP

#: How long a loaded page may take to draw what is looked for, each of the two loads.
DRAW_TIMEOUT_MS = 45_000


def show(page, url: str, text: str, screenshots: Path, name: str, *, exact: bool = False) -> None:
    """Load ``url`` until ``text`` is on it.

    A page reads its data once, as it loads: when one of its API calls fails or times out (seen in
    CI while the other test process builds images), it stays blank, and a user would load it
    again. So a page without ``text`` after :data:`DRAW_TIMEOUT_MS` is loaded once more; still
    without it, the failure says what the page and the server showed (and both loads are
    screenshotted as ``<name>-blank-<n>.png``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in (1, 2):
        page.goto(url, wait_until="networkidle", timeout=60_000)
        try:
            page.get_by_text(text, exact=exact).first.wait_for(timeout=DRAW_TIMEOUT_MS)
            return
        except PlaywrightTimeout:
            page.screenshot(path=screenshots / f"{name}-blank-{attempt}.png", full_page=True)
    parts = urlsplit(url)
    try:
        health = HTTP.get(f"{parts.scheme}://{parts.netloc}/api/health", timeout=10).status_code
    except httpx.HTTPError as error:
        health = repr(error)
    raise AssertionError(f"{url} did not show {text!r} in two loads; the server's health: {health}; the page said: {page.inner_text('body')[-1500:]!r}")
