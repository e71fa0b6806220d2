"""The host's view of a running container (sandbox/container_view.py): asked of the engine once, kept while its init lives."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from prefect_harbor.sandbox import container_view
from prefect_harbor.sandbox.container_view import ContainerRoot


def inspected(pid: int, *, workdir: str = "/app", networks: dict | None = None) -> bytes:
    """The engine's inspection of a container (``GET /containers/NAME/json``), cut to what the view reads."""
    details = {
        "State": {"Pid": pid},
        "GraphDriver": {"Data": {"MergedDir": "/var/lib/containers/storage/overlay/abc/merged"}},
        "Config": {"WorkingDir": workdir},
        "NetworkSettings": {"Networks": networks if networks is not None else {"prefect-harbor": {"IPAddress": "10.89.0.7", "GlobalIPv6Address": ""}}},
    }
    return json.dumps(details).encode()


@pytest.fixture
def init() -> Iterator[subprocess.Popen[bytes]]:
    """A real process to stand for a container's init (the view checks its start time in /proc)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def found(body: bytes, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=body)


class FakeEngine:
    """The engine's service as the view calls it: each request recorded, answered in turn (the last answer again when they run out)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answers: list[httpx.Response] = []

    def answer(self, *responses: httpx.Response) -> None:
        self.answers = list(responses)

    async def __call__(self, method: str, path: str, *, timeout: float | None = None) -> httpx.Response:
        self.calls.append((method, path))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    fake = FakeEngine()
    monkeypatch.setattr(container_view, "_VIEWS", {})
    monkeypatch.setattr(container_view, "engine_call", fake)
    return fake


def test_a_view_reads_the_init_the_root_the_workdir_and_the_addresses(init, engine):
    engine.answer(found(inspected(init.pid, networks={"a": {"IPAddress": "10.89.0.7", "GlobalIPv6Address": "fd00::7"}})))
    view = asyncio.run(ContainerRoot.of("ph-trial"))
    assert view is not None and view.init_pid == init.pid and view.workdir == "/app"
    assert str(view.root) == "/var/lib/containers/storage/overlay/abc/merged" and view.addresses == ("10.89.0.7", "fd00::7")
    assert engine.calls == [("GET", "/libpod/containers/ph-trial/json")]


def test_a_trial_asking_again_costs_no_engine_call_while_its_init_lives(init, engine):
    engine.answer(found(inspected(init.pid)))
    first = asyncio.run(ContainerRoot.of("ph-trial"))
    assert asyncio.run(ContainerRoot.of("ph-trial")) is first and len(engine.calls) == 1


def test_a_view_whose_init_ended_is_asked_again_so_a_reused_pid_is_never_taken_for_it(init, engine):
    engine.answer(found(inspected(init.pid)), found(b'{"message": "no such container"}', 404))
    assert asyncio.run(ContainerRoot.of("ph-trial")) is not None
    init.kill()
    init.wait()
    assert asyncio.run(ContainerRoot.of("ph-trial")) is None and len(engine.calls) == 2


def test_a_kept_view_whose_pid_now_names_another_process_is_dropped(init, engine):
    """The same pid, a different start time: another process took the number."""
    engine.answer(found(inspected(init.pid)))
    view = asyncio.run(ContainerRoot.of("ph-trial"))
    assert view is not None
    container_view._VIEWS["ph-trial"] = ContainerRoot(view.init_pid, view.root, view.workdir, view.init_started - 1)
    assert asyncio.run(ContainerRoot.of("ph-trial")) == view and len(engine.calls) == 2


@pytest.mark.parametrize(
    "output",
    [b"", b"{}", b"not json", inspected(0), json.dumps({"State": {"Pid": 1}}).encode(), inspected(2**22 + 12345)],
    ids=["empty", "no-container", "garbage", "stopped", "fields-missing", "pid-of-no-process"],
)
def test_no_view_of_a_container_the_engine_cannot_show_running(engine, output):
    engine.answer(found(output))
    assert asyncio.run(ContainerRoot.of("ph-trial")) is None
    assert container_view._VIEWS == {}


def test_no_network_means_no_addresses_and_an_odd_workdir_means_root(init, engine):
    engine.answer(found(inspected(init.pid, workdir="", networks={})))
    view = asyncio.run(ContainerRoot.of("ph-trial"))
    assert view is not None and view.addresses == () and view.workdir == "/"
