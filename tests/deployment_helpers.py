"""Helpers for tests that drive deployments on a real `prefect server`."""

import os
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


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
