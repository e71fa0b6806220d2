"""The exit clock (sandbox/exit_clock.py), run on the host as the sandbox runs it on a
container's init: it times a short process's exit by its marker, before its parent learns of it."""

import os
import secrets
import subprocess
import sys
import time

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


def test_a_short_process_is_timed_to_its_exit_not_to_when_its_caller_returns():
    marker = f"PH_EXIT_CLOCK_TEST={secrets.token_hex(8)}"
    helper = clock(marker)
    started = time.time_ns()
    subprocess.run(["sh", "-c", "sleep 0.05"], env={"PATH": os.defpath, marker.split("=")[0]: marker.split("=")[1]}, check=True)
    returned = time.time_ns()
    time.sleep(0.5)  # as podman exec returns late: the clock must not say "now"
    exited = int(told(helper))
    assert started + 40_000_000 < exited < returned + 100_000_000, (exited - started) / 1e6


def test_a_process_never_seen_gives_no_time():
    helper = clock(f"PH_EXIT_CLOCK_TEST={secrets.token_hex(8)}")
    time.sleep(0.05)
    assert told(helper) == b""


def test_the_exec_is_timed_by_its_first_process_not_by_a_child_that_exits_sooner():
    marker = f"PH_EXIT_CLOCK_TEST={secrets.token_hex(8)}"
    helper = clock(marker)
    started = time.time_ns()
    subprocess.run(["sh", "-c", "sleep 0.05; sleep 0.3; true"], env={"PATH": os.defpath, marker.split("=")[0]: marker.split("=")[1]}, check=True)
    time.sleep(0.2)
    assert int(told(helper)) > started + 340_000_000, "the child sleep 0.05 carries the marker too, and exits first"
