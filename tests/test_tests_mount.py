"""The verifier's ``/tests`` without a container: what goes into the read-only fallback, and the helper's words."""

import os

from prefect_harbor.sandbox import tests_mount
from prefect_harbor.sandbox.tests_mount import copy_tree
from prefect_harbor.sandbox.verifier_tests import _describe, publish_files


def test_the_fallback_copy_keeps_links_as_links_and_makes_scripts_executable(tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    source = tmp_path / "tests"
    (source / "data").mkdir(parents=True)
    (source / "test.sh").write_text("true\n")
    (source / "data" / "expected.txt").write_text("42\n")
    (source / "secret.txt").symlink_to(secret)
    target = tmp_path / "floor"
    publish_files(source, target)
    assert (target / "secret.txt").is_symlink() and os.readlink(target / "secret.txt") == str(secret)
    assert os.stat(target / "test.sh").st_mode & 0o777 == 0o755
    assert os.stat(target / "data" / "expected.txt").st_mode & 0o777 == 0o644


def test_the_helpers_copy_leaves_out_fifos_and_never_follows_a_link(tmp_path):
    """copy_tree is the helper's own (the immutable flag needs a tmpfs: tested in tests/sandbox)."""
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "sub").mkdir(parents=True)
    target.mkdir()
    (source / "sub" / "link").symlink_to("/etc/hostname")
    os.mkfifo(source / "fifo")
    reader = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    writer = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        copy_tree(reader, writer, os.getuid(), os.getgid(), immutable=False)
    finally:
        os.close(reader)
        os.close(writer)
    assert sorted(path.name for path in target.rglob("*")) == ["link", "sub"]
    assert os.readlink(target / "sub" / "link") == "/etc/hostname"


def test_the_helpers_failures_are_put_in_words():
    assert _describe(["error", "fsopen", "38"]) == "fsopen: Function not implemented"
    assert _describe(["error", "same-namespace", "0"]) == "same-namespace"
    assert _describe([]) == "the helper stopped without saying why"


class _Processes:
    """A process table for the guard: pid -> (parent, pid namespace, start tick); ``ended`` pids vanish when read."""

    CONTAINER, HOST = 1, 2

    def __init__(self, monkeypatch, table, ended=()):
        self.table, self.ended = dict(table), set(ended)
        monkeypatch.setattr(tests_mount, "_parent", lambda pid: self._row(pid)[0])
        monkeypatch.setattr(tests_mount, "_pid_namespace", lambda pid: self._row(pid)[1])
        monkeypatch.setattr(tests_mount, "_started", lambda pid: self._row(pid)[2])

    def _row(self, pid):
        if pid in self.ended:  # the runtime leaves: its child is adopted by conmon (pid 50)
            self.ended.discard(pid)
            del self.table[pid]
            self.table[11] = (50, *self.table[11][1:])
            raise FileNotFoundError(pid)
        return self.table[pid]


def _guard(since):
    guard = tests_mount.Guard.__new__(tests_mount.Guard)
    guard._init_pid, guard._pid_namespace, guard._since = 10, _Processes.CONTAINER, since
    return guard


def test_the_verifiers_exec_is_allowed_while_the_runtime_that_started_it_leaves(monkeypatch):
    # bash (11, the exec's first process, started at tick 200) runs test.sh (12); its parent crun (40) ends
    # between the guard's reading of bash's parent and of crun's namespace: bash now belongs to conmon (50).
    table = {10: (5, 1, 100), 11: (40, 1, 200), 12: (11, 1, 201), 40: (5, 2, 199), 50: (1, 2, 90), 5: (1, 2, 80)}
    _Processes(monkeypatch, table, ended={40})
    assert _guard(since=150).allows(12)


def test_a_process_the_agent_left_running_is_refused_and_so_is_its_child(monkeypatch):
    # 21 was exec'd by the agent at tick 120, before the tests were attached at 150; 22 is its child from tick 300.
    table = {10: (5, 1, 100), 21: (50, 1, 120), 22: (21, 1, 300), 30: (10, 1, 310), 50: (1, 2, 90), 5: (1, 2, 80)}
    _Processes(monkeypatch, table)
    guard = _guard(since=150)
    assert not guard.allows(21) and not guard.allows(22)
    assert not guard.allows(30), "an orphan adopted by the container's init is not provably the verifier's"
    assert guard.allows(5), "the host's own processes are not the container's"
