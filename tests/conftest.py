"""Shared fixtures: one real Prefect server per test session."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiers import refuse_in_the_unit_tier

#: pytest keeps each test module's rewritten asserts in ``__pycache__`` (ignored by git and by
#: bundles) unless bytecode writing is off, as PYTHONDONTWRITEBYTECODE turns it off on some machine
#: images: then every process of the suite rewrites all test modules again, ~6 s of CPU each.
sys.dont_write_bytecode = False

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


#: Where the tests on the session's `prefect server start` live (the ``ui_server`` fixture: UI,
#: deployments, serve, workers). They share that server and its one `prefect-harbor serve`, so
#: under pytest-xdist they run in one process, in order (see ``SuiteScheduling``).
UI_SERVER_TESTS = ("tests/ui/", "tests/integration/test_deployments.py")

#: What the UI-server group started (its server, its serve): closed after the group's last test in
#: its process, not at the session's end. An idle `prefect server start` costs ~7 s of CPU a
#: minute, which every test after the group would otherwise pay.
UI_GROUP = contextlib.ExitStack()


def in_ui_group(item: pytest.Item | None) -> bool:
    return item is not None and item.nodeid.startswith(UI_SERVER_TESTS)


#: Folders whose every test is in the integration tier (or the slow one, if marked so).
INTEGRATION_FOLDERS = ("tests/integration/", "tests/ui/")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under :data:`INTEGRATION_FOLDERS` are marked integration. The UI-server tests first
    (the longest group: started first, it does not become the tail of a two-process run), and
    among them the process-worker tests last: their `prefect deploy` takes the deployment names
    the shared `prefect-harbor serve` serves, so it is stopped for them, and runs no more after."""
    for item in items:  # the folder names the tier: real trials, servers and browsers are never unit tests
        if item.nodeid.startswith(INTEGRATION_FOLDERS) and not any(item.iter_markers("slow")):
            item.add_marker(pytest.mark.integration)
    stray = [item.nodeid for item in items if "ui_server" in item.fixturenames and not in_ui_group(item)]
    if stray:
        raise pytest.UsageError(f"tests on the shared ui_server must live under {UI_SERVER_TESTS} (conftest.py): {stray}")
    on_server = [item for item in items if in_ui_group(item)]
    on_worker = [item for item in on_server if "worker" in item.fixturenames]
    items[:] = [item for item in on_server if item not in on_worker] + on_worker + [item for item in items if item not in on_server]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (``-n 2``, what scripts/dev.sh runs): whole modules to a process, so a
    module's fixtures (the isolation suite's sweep of probes, for one) are built once; and every
    UI-server test to the same process."""
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "ui-server" if module.startswith(UI_SERVER_TESTS) else module

    config.option.loadscopereorder = False  # keep the collection's order: the UI-server group first
    return SuiteScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the UI-server group's last test in this process, stop its server and serve (:data:`UI_GROUP`)."""
    try:
        return (yield)
    finally:
        if in_ui_group(item) and not in_ui_group(nextitem):
            UI_GROUP.close()


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """A real temporary Prefect server (SQLite) for the whole session: started once, ~15 s."""
    from prefect.testing.utilities import prefect_test_harness

    refuse_in_the_unit_tier("a Prefect server")

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (in-memory, no auth): its endpoint URL."""
    from moto.server import ThreadedMotoServer

    refuse_in_the_unit_tier("moto's S3 server")

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_bucket(moto_endpoint: str, request: pytest.FixtureRequest) -> tuple[str, dict]:
    """A fresh bucket on the moto server: ("s3://bucket", storage_options)."""
    import s3fs

    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": moto_endpoint}}
    bucket = "t-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
    s3fs.S3FileSystem(**options).mkdir(bucket)
    s3fs.S3FileSystem.clear_instance_cache()
    return f"s3://{bucket}", options


SEAWEED_KEY, SEAWEED_SECRET = "seaweed-test-key", "seaweed-test-secret"


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SeaweedFS (`weed mini`): a real S3 server with SigV4 auth and data on disk."""
    import shutil
    import subprocess
    import sys
    import time
    from pathlib import Path

    refuse_in_the_unit_tier("SeaweedFS")
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    data = tmp_path_factory.mktemp("seaweedfs")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": SEAWEED_KEY, "AWS_SECRET_ACCESS_KEY": SEAWEED_SECRET}
    process = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false", "-admin.ui=false",
         "-s3.port.iceberg=0", "-s3.port.lance=0"],
        env=env, stdout=open(data / "weed.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    import s3fs

    endpoint = "http://127.0.0.1:8333"
    fs = s3fs.S3FileSystem(key=SEAWEED_KEY, secret=SEAWEED_SECRET, client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    deadline = time.monotonic() + 60
    while True:  # the port opens before S3 answers: wait for a real request to succeed
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited: {(data / 'weed.log').read_text()[-2000:]}")
        try:
            fs.ls("")
            break
        except Exception:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("SeaweedFS's S3 API did not answer within 60 s") from None
            time.sleep(0.2)
    yield endpoint
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real `prefect server start` (API and UI) on a free port, with its own SQLite home: its base URL."""
    from deployment_helpers import prefect_server

    # With the server's log stream on, as the README suggests, `prefect deployment run --watch` prints the run's log lines too.
    streams_logs = {"PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true", "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true"}
    return UI_GROUP.enter_context(prefect_server(tmp_path_factory.mktemp("prefect-ui-home"), env=streams_logs))


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Debian chromium driven by Playwright (its own browser download cannot work here).

    Per module: while Playwright's sync API is open, its event loop runs in this thread, and
    every asyncio test after it in the same process would fail ("cannot be called from a
    running event loop"); closed, it leaves nothing behind.
    """
    import shutil

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: scripts/dev.sh installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield launched
        launched.close()


@pytest.fixture
def screenshots() -> Path:
    """Where UI tests save screenshots (kept after the run: look at them)."""
    folder = Path(os.environ.get("PREFECT_HARBOR_SCREENSHOTS", Path(__file__).parent.parent / "test-artifacts" / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def serve_process(ui_server: str, tmp_path_factory: pytest.TempPathFactory) -> object:
    """The session's one `prefect-harbor serve` (deployment_helpers.SharedServe), started by `served` when first needed."""
    from deployment_helpers import SharedServe

    shared = SharedServe(ui_server, tmp_path_factory.mktemp("serve"))
    UI_GROUP.callback(shared.stop)  # before the server it talks to (callbacks run last-in first-out)
    return shared


@pytest.fixture
def served(ui_server: str, serve_process, tmp_path) -> Iterator[dict]:
    """`prefect-harbor serve` (shared, see SharedServe) against the real server: the environment to reach it with.

    Its deployments: ``sweep`` and ``prewarm`` with the ``deploy-examples`` block, and ``nightly``,
    paused (``serve_process.nightly_resumed()`` lets it fire). Runs a test left under way are
    stopped after it, as a per-test serve would have.
    """
    from deployment_helpers import HTTP, api_env

    serve_process.ensure_running()
    yield api_env(ui_server, tmp_path)
    for flow, name in (("evaluation-sweep", "sweep"), ("prewarm", "prewarm")):
        deployment = HTTP.get(f"{ui_server}/api/deployments/name/{flow}/{name}", timeout=30)
        if deployment.status_code == 200:
            serve_process.stop_runs(deployment.json()["id"])
