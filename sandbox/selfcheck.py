"""A self-check suite that any Harbor environment used for trials must pass.

In the spirit of inspect_ai's sandbox self-check: each check takes a STARTED
environment, exercises one promise Harbor's agents and verifiers rely on, and raises
``AssertionError`` with a message when the promise is broken. Tests run every check
against a fresh environment (see ``tests/sandbox/test_selfcheck.py``); another
environment implementation can reuse the same list.

Checks that need a particular lifecycle (a no-network environment, a stop) are in
``LIFECYCLE_CHECKS`` and receive the environment before it is started.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from harbor.environments.base import BaseEnvironment

Check = Callable[[BaseEnvironment], Awaitable[None]]


def _ok(result, what: str) -> str:
    assert result.return_code == 0, f"{what}: exit {result.return_code}, stderr={result.stderr!r}"
    return (result.stdout or "").strip()


async def exec_reports_exit_codes(env: BaseEnvironment) -> None:
    assert (await env.exec("exit 0")).return_code == 0
    assert (await env.exec("exit 3")).return_code == 3
    assert (await env.exec("this-command-does-not-exist")).return_code == 127


async def exec_separates_stdout_and_stderr(env: BaseEnvironment) -> None:
    result = await env.exec("echo out; echo err >&2")
    assert (result.stdout or "").strip() == "out", result
    assert (result.stderr or "").strip() == "err", result


async def exec_honours_cwd(env: BaseEnvironment) -> None:
    _ok(await env.exec("mkdir -p /tmp/selfcheck-cwd"), "mkdir")
    assert _ok(await env.exec("pwd", cwd="/tmp/selfcheck-cwd"), "pwd") == "/tmp/selfcheck-cwd"


async def exec_honours_env(env: BaseEnvironment) -> None:
    value = "a value with spaces and $dollar"
    out = _ok(await env.exec('printf %s "$SELFCHECK_VAR"', env={"SELFCHECK_VAR": value}), "env")
    assert out == value, out


async def exec_does_not_leak_host_environment(env: BaseEnvironment) -> None:
    os.environ["SELFCHECK_HOST_SECRET"] = "must-not-leak"
    try:
        out = await env.exec('printf %s "${SELFCHECK_HOST_SECRET:-unset}"')
    finally:
        del os.environ["SELFCHECK_HOST_SECRET"]
    assert out.stdout == "unset", out


async def exec_runs_as_user(env: BaseEnvironment) -> None:
    assert _ok(await env.exec("id -u", user="root"), "root") == "0"
    assert _ok(await env.exec("id -u", user="nobody"), "nobody") == "65534"
    assert _ok(await env.exec("id -u", user=65534), "uid") == "65534"


async def exec_times_out_and_kills_the_tree(env: BaseEnvironment) -> None:
    marker = f"{secrets.randbelow(10**6) + 10**6}"
    try:
        await env.exec(f"sleep {marker} & sleep {marker}", timeout_sec=1)
    except RuntimeError as error:
        assert "timed out" in str(error), error
    else:
        raise AssertionError("a command past its timeout returned instead of raising")
    await asyncio.sleep(0.2)
    survivors = _ok(await env.exec(f"pgrep -f 'slee[p] {marker}' || true"), "pgrep")
    assert survivors == "", f"processes survived the timeout: {survivors}"


async def exec_cancellation_kills_the_tree(env: BaseEnvironment) -> None:
    marker = f"{secrets.randbelow(10**6) + 2 * 10**6}"
    task = asyncio.ensure_future(env.exec(f"sleep {marker} & sleep {marker}"))
    await asyncio.sleep(0.5)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0.2)
    survivors = _ok(await env.exec(f"pgrep -f 'slee[p] {marker}' || true"), "pgrep")
    assert survivors == "", f"processes survived cancellation: {survivors}"


async def exec_streams_output_to_the_callback(env: BaseEnvironment) -> None:
    """Harbor shows a running command's output through ``scoped_output_callback``."""
    seen: list[tuple[str, str]] = []

    async def collect(text: str, stream: str) -> None:
        seen.append((stream, text))

    with env.scoped_output_callback(collect):
        result = await env.exec("echo first; echo oops >&2; sleep 0.3; echo second")
    streamed = {stream: "".join(t for s, t in seen if s == stream) for stream in ("stdout", "stderr")}
    assert streamed == {"stdout": "first\nsecond\n", "stderr": "oops\n"}, seen
    assert result.stdout == "first\nsecond\n"


async def exec_returns_large_output(env: BaseEnvironment) -> None:
    out = _ok(await env.exec("head -c 8000000 /dev/zero | tr '\\0' 'x'"), "large")
    assert len(out) == 8_000_000, len(out)


async def exec_survives_binary_output(env: BaseEnvironment) -> None:
    result = await env.exec("printf '\\377\\376binary\\000tail'")
    assert result.return_code == 0
    assert "binary" in (result.stdout or "") and "tail" in (result.stdout or ""), result


async def file_round_trip(env: BaseEnvironment) -> None:
    payload = os.urandom(256 * 1024)
    with tempfile.TemporaryDirectory() as scratch:
        source, back = Path(scratch, "in.bin"), Path(scratch, "out.bin")
        source.write_bytes(payload)
        await env.upload_file(source, "/tmp/selfcheck/nested/file.bin")
        await env.download_file("/tmp/selfcheck/nested/file.bin", back)
        assert back.read_bytes() == payload


async def directory_round_trip(env: BaseEnvironment) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch, "src")
        (source / "a" / "b").mkdir(parents=True)
        (source / "top.txt").write_text("top")
        (source / "a" / "b" / "deep.bin").write_bytes(b"\x00\xff" * 1000)
        (source / "a" / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (source / "a" / "run.sh").chmod(0o755)
        await env.upload_dir(source, "/tmp/selfcheck-dir")
        assert _ok(await env.exec("/tmp/selfcheck-dir/a/run.sh"), "uploaded script") == "ran"
        back = Path(scratch, "back")
        await env.download_dir("/tmp/selfcheck-dir", back)
        assert (back / "top.txt").read_text() == "top"
        assert (back / "a" / "b" / "deep.bin").read_bytes() == b"\x00\xff" * 1000


async def background_process_survives_between_execs(env: BaseEnvironment) -> None:
    _ok(await env.exec("tmux new-session -d -s selfcheck 'sleep 600'"), "tmux")
    _ok(await env.exec("nohup sleep 601 >/dev/null 2>&1 &"), "nohup")
    await asyncio.sleep(0.2)
    _ok(await env.exec("tmux has-session -t selfcheck"), "tmux session gone")
    _ok(await env.exec("pgrep -f 'slee[p] 601'"), "background process gone")


async def writes_stay_inside_the_environment(env: BaseEnvironment) -> None:
    """Root may write anywhere in its own root filesystem (apt-get in test.sh needs it), never on the host's."""
    marker = f"selfcheck-{secrets.token_hex(4)}"
    for path in (f"/usr/{marker}", f"/etc/{marker}", f"/tmp/{marker}", f"/{marker}"):
        _ok(await env.exec(f"touch {path}", user="root"), f"writing {path} inside")
        assert not Path(path).exists(), f"a write to {path} inside the environment reached the host"
    remount = await env.exec("mount -t tmpfs none /mnt 2>&1 || exit 1", user="root")
    assert remount.return_code != 0, "root inside the environment could mount filesystems"


async def kernel_settings_are_read_only(env: BaseEnvironment) -> None:
    before = Path("/proc/sys/kernel/printk_ratelimit_burst").read_text()
    result = await env.exec("echo 97 > /proc/sys/kernel/printk_ratelimit_burst", user="root")
    assert result.return_code != 0, "root inside the environment could write /proc/sys"
    assert Path("/proc/sys/kernel/printk_ratelimit_burst").read_text() == before


async def hostname_is_the_container_id(env: BaseEnvironment) -> None:
    """Harbor's terminus-2 prompts read ``root@<12-hex id>:`` as under Docker."""
    hostname = _ok(await env.exec("cat /proc/sys/kernel/hostname"), "hostname")
    assert len(hostname) == 12 and all(c in "0123456789abcdef" for c in hostname), hostname


CHECKS: dict[str, Check] = {
    check.__name__: check
    for check in (
        exec_reports_exit_codes,
        exec_separates_stdout_and_stderr,
        exec_honours_cwd,
        exec_honours_env,
        exec_does_not_leak_host_environment,
        exec_runs_as_user,
        exec_times_out_and_kills_the_tree,
        exec_cancellation_kills_the_tree,
        exec_streams_output_to_the_callback,
        exec_returns_large_output,
        exec_survives_binary_output,
        file_round_trip,
        directory_round_trip,
        background_process_survives_between_execs,
        writes_stay_inside_the_environment,
        kernel_settings_are_read_only,
        hostname_is_the_container_id,
    )
}


async def no_network_is_enforced(env: BaseEnvironment) -> None:
    """``env`` must have been created for a ``no-network`` task; starts and stops it."""
    await env.start(force_build=False)
    try:
        probe = (
            "python3 -c \"import socket; s=socket.socket(); s.settimeout(2); "
            "s.connect(('1.1.1.1', 53))\""
        )
        assert (await env.exec(probe)).return_code != 0, "a no-network sandbox reached the internet"
        interfaces = _ok(await env.exec("ls /sys/class/net 2>/dev/null || cat /proc/net/dev"), "interfaces")
        assert "eth" not in interfaces and "ens" not in interfaces, interfaces
    finally:
        await env.stop(delete=True)


async def nothing_is_left_after_stop(env: BaseEnvironment) -> None:
    """Starts ``env``, leaves daemons behind inside it, stops it, scans the host's processes."""
    marker = f"{secrets.randbelow(10**6) + 3 * 10**6}"
    await env.start(force_build=False)
    try:
        _ok(await env.exec(f"tmux new-session -d -s left 'sleep {marker}'"), "tmux")
        _ok(await env.exec(f"setsid nohup sleep {marker} >/dev/null 2>&1 &"), "setsid")
    finally:
        await env.stop(delete=True)
    await asyncio.sleep(0.2)
    survivors = [
        pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, f"sleep {marker}")
    ]
    assert not survivors, f"processes outlived stop(): {survivors}"


def _cmdline_has(pid: str, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


LIFECYCLE_CHECKS: dict[str, Check] = {
    check.__name__: check for check in (no_network_is_enforced, nothing_is_left_after_stop)
}
