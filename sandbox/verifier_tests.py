"""The task's tests at ``/tests``: absent while the agent works, fresh and writable for the verifier.

Harbor uploads the tests when verification starts, into a folder the verifier may write in
(a Terminal-Bench test runs ``python setup.py build_ext --inplace`` in ``/tests``). Here the
agent must not touch them first, nor a process it left running:

* from the container's start, ``/tests`` is a read-only mount of an empty host folder (the
  *floor*), so nothing can be planted there while the agent works;
* each upload of Harbor's verifier goes into a host folder of its own (the *staging*), never
  mounted; then a new tmpfs holding the whole staging folder is attached over ``/tests`` in
  one step, replacing the copies attached before, and guarded against every process that was
  not started by an exec after it (:mod:`.tests_mount`): the verifier writes there as under
  Docker; a process the agent left running can neither read, change, rename nor remove a
  test, nor fill a file of its own there. A multi-step task's verifier gets every step's tests
  uploaded so far, fresh, without what an earlier step's verifier or the agent since wrote.

Attaching needs host root (``setns`` into the container's mount namespace). Where that fails
(a rootless engine, an old kernel), the tests are published into the read-only floor as
before, and the trial's log says the verifier's ``/tests`` are read-only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

from prefect_harbor.sandbox import tests_mount
from prefect_harbor.sandbox.container_view import ContainerRoot
from prefect_harbor.sandbox.spawn import EngineProcess, start_engine_process

#: How long the helper may take to copy the tests and attach them.
_ATTACH_TIMEOUT_SEC = 120


class VerifierTests:
    """One trial's ``/tests``: its read-only floor, its staging folder and the copies attached over it."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter, *, size_mb: int):
        """``size_mb`` bounds the copy (the task's own tests and what the verifier adds): the trial's memory limit."""
        self._logger = logger
        self._size_mb = size_mb
        self._parent = Path(tempfile.mkdtemp(prefix="prefect-harbor-tests-"))  # 0700: no host user reaches below
        self.floor = self._parent / "floor"
        self._staging = self._parent / "staging"
        for folder in (self.floor, self._staging):
            folder.mkdir()
            folder.chmod(0o755)
        self._attached = 0
        self._guard: EngineProcess | None = None  # the helper guarding the copy attached last
        self._read_only_since: str | None = None

    @property
    def writable(self) -> bool:
        """False once attaching failed: the verifier then reads its tests from the read-only floor."""
        return self._read_only_since is None

    async def publish(self, container: str, source: Path, target: PurePosixPath, tests_dir: PurePosixPath) -> None:
        """Add ``source`` (host files Harbor selected) at ``target`` under ``/tests``, then show the verifier all of them."""
        relative = target.relative_to(tests_dir)
        if not self.writable:
            await asyncio.to_thread(publish_files, source, self.floor / relative)
            return
        await asyncio.to_thread(publish_files, source, self._staging / relative)
        failure = await self._attach(container)
        if failure is None:
            self._attached += 1
            return
        self._read_only_since = failure
        self._logger.warning(f"The verifier's /tests are read-only in this trial: a fresh writable copy could not be attached ({failure}).")
        await asyncio.to_thread(shutil.copytree, self._staging, self.floor, symlinks=True, dirs_exist_ok=True)

    async def _attach(self, container: str) -> str | None:
        """None once a fresh copy of the staging folder is at ``/tests``; else what failed."""
        if os.geteuid() != 0:
            return "the engine is not host root's"
        root = await ContainerRoot.of(container)
        if root is None:
            return "the container is not running"
        helper = await start_engine_process(
            [sys.executable, "-I", "-S", tests_mount.__file__, str(root.init_pid), str(self._staging), str(self._attached), str(self._size_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": os.defpath},
        )  # fmt: skip
        assert helper.stdout is not None  # started with stdout=PIPE
        try:
            line = await asyncio.wait_for(helper.stdout.readline(), _ATTACH_TIMEOUT_SEC)
        except TimeoutError:
            line = b"error timeout 0"
        except BaseException:
            await self._end(helper)
            raise
        if line.strip() != b"attached":
            await self._end(helper)
            return _describe(line.decode(errors="replace").split())
        previous, self._guard = self._guard, helper
        if previous is not None:  # its copy is detached: nothing left to guard
            await self._end(previous)
        return None

    async def close(self) -> None:
        """Stop guarding (the container is going) and remove the host folders."""
        if self._guard is not None:
            await self._end(self._guard)
            self._guard = None
        await asyncio.to_thread(shutil.rmtree, self._parent, True)

    async def _end(self, helper: EngineProcess) -> None:
        """Stop a helper; the refusals it described (a process kept from the tests) go to the trial's log."""
        helper.kill()
        await helper.wait()
        said = (await helper.stderr.read()).decode(errors="replace") if helper.stderr is not None else ""
        for refusal in said.splitlines()[: tests_mount.DESCRIBED_REFUSALS]:
            self._logger.info(f"The verifier's /tests guard {refusal}")


def _describe(words: list[str]) -> str:
    if len(words) == 3 and words[0] == "error" and words[2].isdigit():
        errno = int(words[2])
        return f"{words[1]}: {os.strerror(errno)}" if errno else words[1]
    return "the helper stopped without saying why"


def publish_files(source: Path, target: Path) -> None:
    """Copy the task's tests (host files Harbor selected) into a host folder: readable by every
    user, and scripts executable, since on a read-only floor the verifier's own ``chmod +x``
    cannot run. Links are copied as links, never followed (a link in a task points into the
    container, not at the host's files)."""
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        copied = [target, *target.rglob("*")]
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target, follow_symlinks=False)
        copied = [target]
    for path in copied:
        if path.is_symlink():
            continue
        executable = path.is_dir() or path.suffix == ".sh" or os.access(path, os.X_OK)
        path.chmod(0o755 if executable else 0o644)
