"""Helpers for tests that drive deployments on a real `prefect server`."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from tiers import refuse_in_the_unit_tier

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
#: One HTTP client for a test process's calls to its servers: ``httpx.get`` makes a client (and
#: loads the CA bundle) per call, which the suite's polling loops paid twice a second. No connection
#: is kept between calls: one idle for 2 s by this process's clock can be past uvicorn's 5 s by the
#: server's when the machine is busy (a DELETE was answered "Connection reset by peer" under
#: stress-ng), and a new loopback connection costs next to nothing.
HTTP = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


@contextmanager
def prefect_server(home: Path, env: dict | None = None) -> Iterator[str]:
    """A real `prefect server start` (API and UI) on a free port, with its own SQLite home and ``env`` added.

    Yields the base URL (``http://127.0.0.1:PORT``); the API is at ``<base>/api``.
    """
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_UI_API_URL": f"{base}/api",
        "PREFECT_API_URL": f"{base}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **(env or {}),
    }
    refuse_in_the_unit_tier("prefect server start")
    log = open(home / "server.log", "wb")
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/health", timeout=2)  # open to all, with an auth string too
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"prefect server did not start: {(home / 'server.log').read_text()[-2000:]}") from None
            time.sleep(0.5)
    try:
        yield base
    finally:
        terminate(server, timeout=30)


def terminate(process: subprocess.Popen, timeout: float, group: bool = False) -> None:
    """SIGTERM, then SIGKILL (to its whole process group with ``group``) if it is still there after ``timeout``."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait(timeout=30)


def basic_auth(env: dict) -> tuple[str, str] | None:
    """httpx's ``auth`` for a server with ``PREFECT_SERVER_API_AUTH_STRING`` (Prefect sends the string as HTTP Basic)."""
    auth_string = env.get("PREFECT_API_AUTH_STRING")
    if not auth_string:
        return None
    user, _, password = auth_string.partition(":")
    return user, password


def api(method: str, url: str, **kwargs) -> httpx.Response:
    """One Prefect API call, retried on 503/429 as Prefect's own client does (SQLite answers 503 while locked)."""
    for delay in (0.5, 1, 2, 4, 8):
        response = HTTP.request(method, url, **kwargs)
        if response.status_code not in (429, 503):
            return response
        time.sleep(delay)
    return HTTP.request(method, url, **kwargs)


def log_messages(base: str, flow_run_id: str) -> list[str]:
    """The messages the server holds for a flow run's logs, oldest first."""
    return [log["message"] for log in api("post", f"{base}/api/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC"}).json()]


def wait_until(predicate, timeout: float, what: str, explain=None):
    """``predicate()``'s first true value, checked every half second; fails naming ``what`` after
    ``timeout`` s, with what ``explain()`` says of the state things were in (logs, states)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f"\n{explain()}" if explain else ""))
        time.sleep(0.5)
    return value


def api_env(base: str, tmp_path: Path, **extra: str) -> dict:
    return {**os.environ, "PREFECT_API_URL": f"{base}/api", "PREFECT_RUNNER_POLL_FREQUENCY": "1", "TMPDIR": str(tmp_path), **extra}


def save_backend(env: dict, name: str, tasks_dir: Path, **fields) -> None:
    """Save an oracle, dataset-mode Harbor Backend block from a process of its own (as a user would)."""
    code = (
        f"from prefect_harbor.blocks import HarborBackend as B; "
        f"B(tasks_dir={str(tasks_dir)!r}, task_mode='dataset', agent='oracle', **{fields!r}).save({name!r}, overwrite=True)"
    )
    subprocess.run([str(BIN / "python"), "-c", code], env=env, check=True)


@contextmanager
def process_worker(env: dict, log_dir: Path) -> Iterator[dict]:
    """The prefect.yaml deployments on a process work pool, and a worker polling it: yields its environment.

    The worker's log is ``log_dir/worker.log``. It takes the deployment names a serve process served.
    """
    env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}
    prefect = str(BIN / "prefect")
    subprocess.run([prefect, "work-pool", "create", "harbor-process", "--type", "process", "--overwrite"], env=env, check=True, capture_output=True)
    deploy = subprocess.run([prefect, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all"], env=env, cwd=REPO, capture_output=True, text=True)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    process = subprocess.Popen(
        [prefect, "worker", "start", "--pool", "harbor-process"], env=env, cwd=REPO, stdout=open(log_dir / "worker.log", "wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield env
    finally:
        # Prefect's graceful worker shutdown can outlast the test on a loaded server; what is
        # under test already happened. Never leave a worker polling for the rest of the session.
        terminate(process, timeout=20, group=True)


def wait_for_deployment(base: str, name: str, timeout: float = 90, flow: str = "evaluation-sweep", auth: tuple[str, str] | None = None) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = HTTP.get(f"{base}/api/deployments/name/{flow}/{name}", auth=auth)
        if response.status_code == 200:
            return response.json()
        time.sleep(0.5)
    raise AssertionError(f"deployment {name} never appeared")


def create_flow_run(base: str, deployment_id: str, parameters: dict) -> httpx.Response:
    """POST a run of the deployment, retrying 503s as Prefect's own client does (SQLite is busy under load)."""
    for _ in range(30):
        response = HTTP.post(f"{base}/api/deployments/{deployment_id}/create_flow_run", json={"parameters": parameters})
        if response.status_code != 503:
            break
        time.sleep(1)
    return response


#: Flow-run states after which nothing runs any more.
TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def runs_of(base: str, deployment_id: str) -> list[dict]:
    return api("post", f"{base}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}).json()


class SharedServe:
    """One `prefect-harbor serve` for every test that needs it (starting one costs tens of seconds).

    It serves the on-demand deployments and a ``nightly`` one on a 5 s schedule, which stays
    paused except while `nightly_resumed` is open: otherwise a 5-row sweep would start every few
    seconds under every other test. `stop` (before a process worker takes over the same
    deployment names, and at the end of the session) deletes the nightly deployment with its
    scheduled runs, so no later worker picks up a backlog.
    """

    def __init__(self, base: str, home: Path, env: dict | None = None, nightly: bool = True) -> None:
        self.base, self.home, self.nightly = base, home, nightly
        self.env = api_env(base, home, **(env or {}))
        self.nightly_results = str(home / "scheduled")
        self.process = None

    def ensure_running(self) -> None:
        from paths import EXAMPLE_DATASET, EXAMPLE_TASKS

        if self.process is not None and self.process.poll() is None:
            return
        assert self.process is None, f"serve exited ({self.process.returncode}): {(self.home / 'serve.log').read_text()[-3000:]}"
        save_backend(self.env, "deploy-examples", EXAMPLE_TASKS, n_concurrent=3)
        if not self.nightly:
            self.process = subprocess.Popen(
                [str(BIN / "prefect-harbor"), "serve"], env=self.env, stdout=open(self.home / "serve.log", "ab"), stderr=subprocess.STDOUT
            )
            wait_for_deployment(self.base, "sweep", auth=basic_auth(self.env))
            return
        self.delete_nightly()  # so that its appearing below means this process has applied every deployment
        self.process = subprocess.Popen(
            [str(BIN / "prefect-harbor"), "serve", "--nightly-dataset", str(EXAMPLE_DATASET), "--nightly-backend-block", "deploy-examples",
             "--nightly-results", self.nightly_results, "--interval", "5"],
            env=self.env, stdout=open(self.home / "serve.log", "ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.pause_nightly(wait_for_deployment(self.base, "nightly"))

    def pause_nightly(self, nightly: dict) -> None:
        """Pause the schedule (Prefect deletes the runs it scheduled ahead) and stop any run it already started."""
        api("post", f"{self.base}/api/deployments/{nightly['id']}/pause_deployment").raise_for_status()
        self.stop_runs(nightly["id"])

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the serve process's log (for a failing test's message)."""
        log = self.home / "serve.log"
        return f"--- serve.log (serve {'running' if self.process and self.process.poll() is None else 'exited'}):\n" + (
            log.read_text(errors="replace")[-chars:] if log.exists() else "(none)"
        )

    def stop_runs(self, deployment_id: str, timeout: float = 90) -> None:
        """Delete the deployment's runs still waiting, cancel the ones under way, and wait until none is left."""
        start = time.monotonic()
        deadline = start + timeout
        while live := [r for r in runs_of(self.base, deployment_id) if r["state_type"] not in TERMINAL]:
            for run in live:
                if run["state_type"] == "SCHEDULED":
                    HTTP.delete(f"{self.base}/api/flow_runs/{run['id']}", timeout=30)
                elif run["state_type"] != "CANCELLING" or time.monotonic() - start > 30:
                    # CANCELLING for 30 s: no runner holds it (picked up, never started); end it here.
                    state = "CANCELLING" if run["state_type"] != "CANCELLING" else "CANCELLED"
                    HTTP.post(f"{self.base}/api/flow_runs/{run['id']}/set_state", json={"state": {"type": state}, "force": True}, timeout=30)
            assert time.monotonic() < deadline, f"runs of {deployment_id} still under way: {[(r['name'], r['state_type']) for r in live]}"
            time.sleep(1)

    @contextmanager
    def nightly_resumed(self) -> Iterator[tuple[dict, set[str]]]:
        """The schedule firing again: yields the nightly deployment and the ids of its runs from before; paused after."""
        nightly = wait_for_deployment(self.base, "nightly")
        before = {r["id"] for r in runs_of(self.base, nightly["id"])}
        api("post", f"{self.base}/api/deployments/{nightly['id']}/resume_deployment").raise_for_status()
        try:
            yield nightly, before
        finally:
            self.pause_nightly(nightly)

    def delete_nightly(self) -> None:
        nightly = HTTP.get(f"{self.base}/api/deployments/name/evaluation-sweep/nightly", timeout=30)
        if nightly.status_code == 200:
            HTTP.delete(f"{self.base}/api/deployments/{nightly.json()['id']}", timeout=30)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        self.process.wait(timeout=60)
        self.process = None
        # Its 5 s schedule leaves runs scheduled ahead: delete the deployment (and with it those
        # runs), or a later process worker would pick up the backlog.
        if self.nightly:
            self.delete_nightly()
