"""The exit clock (sandbox/exit_clock.py), run on the host as the sandbox runs it on a
container's init: it times an exec's exit by its marker, before its caller learns of it.

The command runs as podman exec runs it: a process named ``runc…`` (runc's init, which the
clock leaves alone until it execs) execs the marked command. A process forked from this test
is not that: it is unmarked, and named ``python``, until it execs."""

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prefect_harbor.sandbox import exit_clock


def clock(marker: str) -> subprocess.Popen[bytes]:
    helper = subprocess.Popen([sys.executable, "-I", "-S", exit_clock.__file__, str(os.getpid()), marker], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert helper.stdout is not None and helper.stdout.readline() == b"ready\n"
    return helper


def told(helper: subprocess.Popen[bytes]) -> bytes:
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdin.close()
    line = helper.stdout.readline()
    helper.wait(5)
    return line.strip()


def run_as_exec(tmp_path: Path, marker: str, script: str) -> None:
    """``script`` (sh) run with ``marker`` in its environment, exec'd by a process named ``runc…``."""
    runc = tmp_path / "runc-init-standin"
    shutil.copy("/bin/sh", runc)
    name, value = marker.split("=")
    subprocess.run([str(runc), "-c", f"({name}={value}; export {name}; exec sh -c '{script}'); true"], env={"PATH": os.defpath}, check=True)


def test_a_short_process_is_timed_to_its_exit_not_to_when_its_caller_returns(tmp_path):
    marker = f"PH_EXIT_CLOCK_TEST={secrets.token_hex(8)}"
    helper = clock(marker)
    started = time.time_ns()
    run_as_exec(tmp_path, marker, "sleep 0.05")
    returned = time.time_ns()
    time.sleep(0.5)  # as podman exec returns late: the clock must not say "now"
    exited = int(told(helper))
    assert started + 40_000_000 < exited < returned + 100_000_000, (exited - started) / 1e6


def test_a_process_never_seen_gives_no_time():
    helper = clock(f"PH_EXIT_CLOCK_TEST={secrets.token_hex(8)}")
    time.sleep(0.05)
    assert told(helper) == b""


def test_the_exec_is_timed_by_its_first_process_not_by_a_child_that_exits_sooner(tmp_path):
    marker = f"PH_EXIT_CLOCK_TEST={secrets.token_hex(8)}"
    helper = clock(marker)
    started = time.time_ns()
    run_as_exec(tmp_path, marker, "sleep 0.05; sleep 0.3; true")
    time.sleep(0.2)
    exited = int(told(helper))
    assert exited > started + 340_000_000, f"timed at {(exited - started) / 1e6:.0f} ms: the child sleep 0.05 carries the marker too, and exits first"


class ProcTable:
    """A container's processes as :func:`exit_clock.find` reads them, each look a snapshot:
    ``looks[i]`` maps pid to (parent, environ) for the i-th scan (the last repeats)."""

    def __init__(self, monkeypatch, looks: list[dict[int, tuple[int, bytes]]]):
        self.looks, self.scan = looks, -1
        monkeypatch.setattr(exit_clock, "_pids", self.pids)
        monkeypatch.setattr(exit_clock, "_comm", lambda pid: b"bash\n")
        monkeypatch.setattr(exit_clock, "_environ", lambda pid: self.now()[pid][1])
        monkeypatch.setattr(exit_clock, "_stat", lambda pid: [b"S", str(self.now()[pid][0]).encode(), *[b"0"] * 17, str(pid).encode()])

    def now(self) -> dict[int, tuple[int, bytes]]:
        return self.looks[min(self.scan, len(self.looks) - 1)]

    def pids(self, procs: str) -> list[int]:
        self.scan += 1
        return sorted(self.now())


MARKED = b"PATH=/bin\0PH=1"


def test_a_process_read_mid_exec_with_no_environment_is_looked_at_again_not_passed_over(monkeypatch):
    # Scan 0: bash has just exec'd, its environment not yet set (reads empty). Scan 1: bash and
    # the subshell it forked for $(cat …). Passed over at scan 0, the subshell would be taken for
    # the exec and timed to its own early exit (a separate verifier flagged for its own reward).
    ProcTable(monkeypatch, [{10: (1, b"")}, {10: (1, MARKED), 11: (10, MARKED)}])
    assert exit_clock.find("procs", b"\0PH=1\0", over=lambda: False) == (10, 10)


def test_a_parent_once_read_as_unmarked_is_read_again_before_its_child_is_taken_for_the_exec(monkeypatch):
    ProcTable(monkeypatch, [{10: (1, b"PATH=/bin")}, {10: (1, MARKED), 11: (10, MARKED)}])
    assert exit_clock.find("procs", b"\0PH=1\0", over=lambda: False) == (10, 10)
