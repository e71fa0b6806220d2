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

    def __init__(self, monkeypatch, table, ended=(), unreadable=None):
        self.table, self.ended = dict(table), set(ended)
        self.unreadable = dict(unreadable or {})  # pid -> reads that fail before it can be read
        monkeypatch.setattr(tests_mount, "_parent", lambda pid: self._row(pid)[0])
        monkeypatch.setattr(tests_mount, "_pid_namespace", lambda pid: self._row(pid)[1])
        monkeypatch.setattr(tests_mount, "_started", lambda pid: self._row(pid)[2])
        monkeypatch.setattr(tests_mount, "_stat", lambda pid: [b"S", str(self._row(pid)[0]).encode(), *[b"0"] * 17, str(self._row(pid)[2]).encode()])

    def _row(self, pid):
        if self.unreadable.get(pid, 0) > 0:  # leaving: its /proc entries answer nothing for a while
            self.unreadable[pid] -= 1
            raise FileNotFoundError(pid)
        if pid in self.ended:  # the runtime leaves: its child is adopted by conmon (pid 50)
            self.ended.discard(pid)
            del self.table[pid]
            self.table[11] = (50, *self.table[11][1:])
            raise FileNotFoundError(pid)
        return self.table[pid]


def _guard(since):
    guard = tests_mount.Guard.__new__(tests_mount.Guard)
    guard._init_pid, guard._pid_namespace, guard._since, guard._told = 10, _Processes.CONTAINER, since, set()
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


def test_a_lineage_unreadable_for_a_while_is_read_again_until_it_settles(monkeypatch):
    # crun (40) takes a while to leave: twenty reads of its namespace fail before bash (11) is seen whole.
    table = {10: (5, 1, 100), 11: (40, 1, 200), 12: (11, 1, 201), 40: (5, 2, 199), 5: (1, 2, 80)}
    _Processes(monkeypatch, table, unreadable={40: 20})
    assert _guard(since=150).allows(12)


def test_a_lineage_that_stays_unreadable_is_refused_and_the_refusal_says_what_was_read(monkeypatch):
    monkeypatch.setattr(tests_mount, "_SETTLE_SEC", 0.05)
    table = {10: (5, 1, 100), 11: (40, 1, 200), 12: (11, 1, 201), 40: (5, 2, 199), 5: (1, 2, 80)}
    processes = _Processes(monkeypatch, table, unreadable={40: 10**9})
    guard = _guard(since=150)
    assert not guard.allows(12)
    said = guard.refusal_to_tell(12)
    assert said.startswith("refused an open by 12 (parent 11, started 201, in the container) <- 11 (parent 40, started 200, in the container) <- 40 unreadable")
    assert said.endswith("tests attached at tick 150, the container's init is 10")
    processes.unreadable.clear()
    assert "21 (parent 50, started 120, in the container) <- 50 (parent 1, started 90, outside the container)" in _agent_left(monkeypatch).refusal_to_tell(22)


def _agent_left(monkeypatch):
    table = {10: (5, 1, 100), 21: (50, 1, 120), 22: (21, 1, 300), 50: (1, 2, 90), 5: (1, 2, 80)}
    _Processes(monkeypatch, table)
    return _guard(since=150)


def test_a_loop_of_refusals_by_the_agents_orphans_is_told_once_and_leaves_room_for_the_verifiers(monkeypatch):
    """A process the agent left opening the tests in a loop filled all five descriptions before, so
    that a refusal of the verifier's own exec, had there been one, was never told."""
    # 30 and 31: orphans of the agent, adopted by the container's init (10); 41: a verifier's process
    # whose exec (40, started at tick 140) predates the attach at 150.
    table = {10: (5, 1, 100), 30: (10, 1, 310), 31: (10, 1, 320), 40: (50, 1, 140), 41: (40, 1, 400), 50: (1, 2, 90), 5: (1, 2, 80)}
    _Processes(monkeypatch, table)
    guard = _guard(since=150)
    told = [guard.refusal_to_tell(pid) for pid in (30, 31, 30, 41, 41)]
    assert told[0] is not None and told[0].startswith("refused an open by 30 (parent 10")
    assert told[1:3] == [None, None], "the init's lineage again"
    assert told[3] is not None and told[3].startswith("refused an open by 41 (parent 40, started 400, in the container) <- 40 (parent 50")
    assert told[4] is None
