"""``prefect-harbor images prune`` on real images: what no sweep used lately goes, what a sweep used
or a container holds stays."""

import io
import json
import os
import secrets
import tarfile
import time

import pytest

from prefect_harbor.sandbox.engine import podman_sync
from prefect_harbor.sandbox.image_disk import STAND_IN_PREFIX, TASK_LABEL, mark_used, prune_task_images, use_marks

pytestmark = pytest.mark.integration


def tiny_image(reference: str, task: str | None = None) -> str:
    """A one-file image of its own content (so of its own id), tagged ``reference``, labelled as ``task``'s."""
    data = secrets.token_bytes(16)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("token")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    label = ["--change", f"LABEL {TASK_LABEL}={json.dumps(task)}"] if task else []
    done = podman_sync("import", *label, "/dev/stdin", reference, stdin=_pipe(archive.getvalue()), timeout=120)
    done.check(f"importing {reference}")
    return reference


def _pipe(data: bytes) -> int:
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def test_prune_removes_what_no_sweep_used_and_keeps_what_a_sweep_or_a_container_uses(tmp_path):
    repository = f"localhost/prefect-harbor/prune-test-{secrets.token_hex(4)}"
    home = tmp_path / "builder"
    old, recent, held = (tiny_image(f"{repository}:{name}") for name in ("old", "recent", "held"))
    # Imported now, each image was made today: judged as if twenty days had passed, with "recent" used on the last.
    judged_at = time.time() + 20 * 86400
    for name in ("old", "held"):
        mark_used(home, f"{repository}:{name}")
    mark_used(home, recent)
    os.utime(use_marks(home) / "recent", (judged_at - 3600, judged_at - 3600))
    container = podman_sync("create", "--name", f"prune-test-{secrets.token_hex(4)}", held, "/token").check("creating a container")
    try:
        pruned = prune_task_images(home, repository, 14, now=judged_at)
        assert pruned.removed == [old] and pruned.in_use == [held] and pruned.kept == 1
        assert not (use_marks(home) / "old").exists()
        assert podman_sync("image", "exists", recent).returncode == 0
        assert podman_sync("image", "exists", held).returncode == 0
        assert podman_sync("image", "exists", old).returncode != 0
        assert "1 removed" in pruned.describe(14) and "1 still used by a container" in pruned.describe(14)
    finally:
        podman_sync("rm", "--force", container.text)
        podman_sync("rmi", "--force", recent, held, old)


def test_a_shipped_stand_in_is_judged_on_its_own_age(tmp_path):
    """The test command prunes task images after 3 hours; a stand-in (a CPython compiled from source) stays its 14 days."""
    repository = f"localhost/prefect-harbor/prune-test-{secrets.token_hex(4)}"
    home = tmp_path / "builder"
    stand_in = tiny_image(f"{repository}:stand-in", task=f"{STAND_IN_PREFIX}python:3.13")
    task = tiny_image(f"{repository}:task", task="hello-world")
    hostile = tiny_image(f"{repository}:hostile", task="a task calling itself a stand-in")
    judged_at = time.time() + 2 * 86400
    try:
        pruned = prune_task_images(home, repository, 0.125, stand_in_unused_days=14, now=judged_at)
        assert sorted(pruned.removed) == sorted([task, hostile]) and pruned.kept == 1
        assert podman_sync("image", "exists", stand_in).returncode == 0
        later = prune_task_images(home, repository, 0.125, stand_in_unused_days=14, now=judged_at + 13 * 86400)
        assert later.removed == [stand_in]
    finally:
        podman_sync("rmi", "--force", stand_in, task, hostile)
