"""The verifier's ``/tests`` without a container: what goes into the read-only fallback, and the helper's words."""

import os

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
