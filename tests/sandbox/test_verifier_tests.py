"""``/tests`` in a real container: absent for the agent, a fresh writable copy for each verification,
closed to what the agent left running, and never a door to the host's files."""

import secrets
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def write_tests(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


async def test_each_verification_gets_a_fresh_writable_copy_and_a_process_from_before_cannot_open_it(make_environment, tmp_path):
    step_one = write_tests(tmp_path / "one", {"test.sh": "echo one\n", "data/expected.txt": "42\n"})
    step_two = write_tests(tmp_path / "two", {"step2.sh": "echo two\n"})
    env = make_environment()
    await env.start(force_build=False)
    try:
        before = await env.exec("ls -A /tests; echo listed")
        await env.upload_dir(step_one, "/tests")
        written = await env.exec("cd /tests && echo built > ext.so && mkdir build && cat data/expected.txt ext.so && id -un")
        # A process started before the next copy, as an agent's lingering one would be.
        await env.exec(
            "nohup sh -c 'for i in $(seq 1200); do [ -e /tests/step2.sh ] && break; sleep 0.1; done; "
            "cat /tests/test.sh > /tmp/read.txt 2>&1; { echo x >> /tests/new.txt; } 2> /tmp/new.part; mv /tmp/new.part /tmp/new.txt' > /dev/null 2>&1 &"
        )
        await env.upload_dir(step_two, "/tests")
        second = await env.exec("ls -A /tests | grep -vx new.txt; cat /tests/test.sh /tests/step2.sh")
        changed = await env.exec("echo more >> /tests/test.sh; rm /tests/test.sh; echo rc=$?")
        lingering = await env.exec("for i in $(seq 1200); do [ -e /tmp/new.txt ] && break; sleep 0.1; done; cat /tmp/read.txt /tmp/new.txt; cat /tests/new.txt | wc -c")
    finally:
        await env.stop(delete=True)
    assert before.stdout.split() == ["listed"], before
    assert written.stdout.split() == ["42", "built", "root"], written
    # (new.txt: the empty file the lingering process could create, not fill)
    assert second.stdout.split() == ["data", "step2.sh", "test.sh", "echo", "one", "echo", "two"], f"the first copy's writes stayed, or a file is missing: {second}"
    assert "Operation not permitted" in changed.stdout + (changed.stderr or "") and "rc=1" in changed.stdout, changed
    assert lingering.stdout.count("Operation not permitted") == 2 and lingering.stdout.split()[-1] == "0", lingering


async def test_a_link_in_the_tasks_tests_never_brings_a_host_file_in(make_environment, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text(f"host-{secrets.token_hex(8)}")
    tests = write_tests(tmp_path / "tests", {"test.sh": "true\n"})
    (tests / "secret.txt").symlink_to(secret)
    env = make_environment()
    await env.start(force_build=False)
    try:
        await env.upload_dir(tests, "/tests")
        seen = await env.exec("readlink /tests/secret.txt; cat /tests/secret.txt; true")
    finally:
        await env.stop(delete=True)
    assert secret.read_text() not in seen.stdout + (seen.stderr or ""), "the host file was copied into the container"
    assert seen.stdout.split()[0] == str(secret), seen
