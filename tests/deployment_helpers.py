"""Helpers for tests that drive deployments on a real `prefect server`."""

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent



def api(method: str, url: str, **kwargs) -> httpx.Response:
    """One Prefect API call, retried on 503/429 as Prefect's own client does (SQLite answers 503 while locked)."""
    for delay in (0.5, 1, 2, 4, 8):
        response = httpx.request(method, url, timeout=30, **kwargs)
        if response.status_code not in (429, 503):
            return response
        time.sleep(delay)
    return httpx.request(method, url, timeout=30, **kwargs)

def api_env(base: str, tmp_path: Path) -> dict:
    return {**os.environ, "PREFECT_API_URL": f"{base}/api", "PREFECT_RUNNER_POLL_FREQUENCY": "1", "TMPDIR": str(tmp_path)}


def wait_for_deployment(base: str, name: str, timeout: float = 90, flow: str = "evaluation-sweep") -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = httpx.get(f"{base}/api/deployments/name/{flow}/{name}")
        if response.status_code == 200:
            return response.json()
        time.sleep(0.5)
    raise AssertionError(f"deployment {name} never appeared")


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

    def __init__(self, base: str, home: Path) -> None:
        self.base, self.home = base, home
        self.env = api_env(base, home)
        self.nightly_results = str(home / "scheduled")
        self.process = None

    def ensure_running(self) -> None:
        import subprocess

        from paths import EXAMPLE_DATASET, EXAMPLE_TASKS

        if self.process is not None and self.process.poll() is None:
            return
        assert self.process is None, f"serve exited ({self.process.returncode}): {(self.home / 'serve.log').read_text()[-3000:]}"
        subprocess.run(
            [str(BIN / "python"), "-c", "from prefect_harbor.blocks import HarborBackend as B; "
             f"B(tasks_dir={str(EXAMPLE_TASKS)!r}, task_mode='dataset', agent='oracle', n_concurrent=3).save('deploy-examples', overwrite=True)"],
            env=self.env, check=True,
        )  # fmt: skip
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

    def stop_runs(self, deployment_id: str, timeout: float = 90) -> None:
        """Delete the deployment's runs still waiting, cancel the ones under way, and wait until none is left."""
        start = time.monotonic()
        deadline = start + timeout
        while live := [r for r in runs_of(self.base, deployment_id) if r["state_type"] not in TERMINAL]:
            for run in live:
                if run["state_type"] == "SCHEDULED":
                    httpx.delete(f"{self.base}/api/flow_runs/{run['id']}", timeout=30)
                elif run["state_type"] != "CANCELLING" or time.monotonic() - start > 30:
                    # CANCELLING for 30 s: no runner holds it (picked up, never started); end it here.
                    state = "CANCELLING" if run["state_type"] != "CANCELLING" else "CANCELLED"
                    httpx.post(f"{self.base}/api/flow_runs/{run['id']}/set_state", json={"state": {"type": state}, "force": True}, timeout=30)
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
        nightly = httpx.get(f"{self.base}/api/deployments/name/evaluation-sweep/nightly", timeout=30)
        if nightly.status_code == 200:
            httpx.delete(f"{self.base}/api/deployments/{nightly.json()['id']}", timeout=30)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        self.process.wait(timeout=60)
        self.process = None
        # Its 5 s schedule leaves runs scheduled ahead: delete the deployment (and with it those
        # runs), or a later process worker would pick up the backlog.
        self.delete_nightly()
