"""Shared fixtures: one real Prefect server per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """A real temporary Prefect server (SQLite) for the whole session: started once, ~15 s."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
