"""podman's REST service, one per process (sandbox/engine_service.py): started on first use, root's alone, replaced when gone, stopped at exit."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from prefect_harbor.sandbox import engine_service
from prefect_harbor.sandbox.engine import EngineError
from prefect_harbor.sandbox.owners import owner_alive, owner_token


def test_a_service_that_cannot_start_fails_in_its_own_words(monkeypatch):
    monkeypatch.setattr(engine_service, "podman_argv", lambda *_: ["sh", "-c", "echo 'cannot open the storage' >&2; exit 125"])
    service = engine_service._Service()
    with pytest.raises(EngineError, match=r"did not start \(exit 125\): cannot open the storage"):
        service.socket()
    service.stop()


def test_a_service_that_never_answers_is_stopped_and_named(monkeypatch):
    monkeypatch.setattr(engine_service, "podman_argv", lambda *_: ["sleep", "60"])
    monkeypatch.setattr(engine_service, "START_TIMEOUT_SEC", 0.5)
    service = engine_service._Service()
    with pytest.raises(EngineError, match="did not answer"):
        service.socket()
    assert service._process is not None and service._process.poll() is not None, "the silent service was left running"
    service.stop()


@pytest.mark.integration
def test_the_service_starts_on_first_use_in_a_folder_only_root_opens_and_in_a_session_of_its_own():
    service = engine_service._Service()
    try:
        socket = service.socket()
        folder = socket.parent.stat()
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == 0
        assert service._process is not None
        assert os.getsid(service._process.pid) != os.getsid(0), "a Ctrl-C to the terminal's process group would stop it"
        assert service.running() == socket and service.socket() == socket  # one service, not one per call
    finally:
        service.stop()
    assert service._process is None and not socket.parent.exists()


@pytest.mark.integration
def test_a_service_that_has_gone_is_replaced_by_the_next_call(monkeypatch):
    service = engine_service._Service()
    monkeypatch.setattr(engine_service, "_SERVICE", service)
    try:
        first = asyncio.run(engine_service.engine_call("GET", "/libpod/_ping"))
        assert first.status_code == 200
        assert service._process is not None
        gone = service._process.pid
        service._process.kill()
        service._process.wait()
        again = asyncio.run(engine_service.engine_call("GET", "/libpod/_ping"))
        assert again.status_code == 200 and service._process.pid != gone
    finally:
        service.stop()


@pytest.mark.integration
def test_the_service_ends_with_the_process_that_started_it(tmp_path):
    script = textwrap.dedent(
        """
        import asyncio
        from prefect_harbor.sandbox import engine_service
        assert asyncio.run(engine_service.engine_call("GET", "/libpod/_ping")).status_code == 200
        print(engine_service._SERVICE._process.pid, engine_service._SERVICE._folder, flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    pid, folder = done.stdout.split()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", "the service outlived its process"
    assert not os.path.exists(folder)


def test_a_name_is_one_path_segment_whatever_it_holds():
    assert engine_service.segment("x/../../_ping?a=#b") == "x%2F..%2F..%2F_ping%3Fa%3D%23b"


@pytest.mark.integration
def test_an_image_reference_that_tries_to_name_another_endpoint_names_no_image():
    """Unescaped, this reference asked ``GET /libpod/networks/prefect-harbor/exists`` (204: yes) from the image lookup."""
    from prefect_harbor.sandbox.images import _exists
    from prefect_harbor.sandbox.network import ensure_network

    ensure_network()
    assert asyncio.run(_exists("x/../../networks/prefect-harbor/exists?a=")) is False


@pytest.mark.integration
def test_a_temporary_folder_too_long_for_a_socket_path_still_gets_a_service(monkeypatch, tmp_path):
    """A test's or a CI job's TMPDIR can be longer than the 107 bytes a socket's path may have."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    service = engine_service._Service()
    try:
        socket = service.socket()
        assert len(os.fsencode(str(socket))) <= 107
    finally:
        service.stop()


def test_the_janitor_removes_the_folders_of_services_whose_owner_died_and_only_those(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"{engine_service.FOLDER_PREFIX}{2**22 + 12345}.1-abcd1234"  # no such pid
    mine = tmp_path / f"{engine_service.FOLDER_PREFIX}{owner_token()}-efgh5678"
    other = tmp_path / "prefect-harbor-something-else"
    for folder in (dead, mine, other):
        folder.mkdir()
        (folder / "service.log").write_text("")
    assert dead in engine_service.reap_orphaned_folders(owner_alive)
    assert not dead.exists() and mine.exists() and other.exists()


@pytest.mark.integration
def test_a_service_folder_is_named_by_its_owner():
    service = engine_service._Service()
    try:
        assert service.socket().parent.name.startswith(f"{engine_service.FOLDER_PREFIX}{owner_token()}-")
    finally:
        service.stop()
