"""Terminal-Bench's old task format (``task.yaml``, ``solution.sh``, ``run-tests.sh``), run as Harbor tasks.

A folder of such tasks is accepted as it is: each task is converted by Harbor's own mapper
(what ``harbor tasks migrate`` runs) into a cache, once per task content, and the sweep runs
the converted copy. The conversion is logged, so a run says which tasks it converted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from prefect_harbor.agents.pyenvs import cache_root

logger = logging.getLogger(__name__)


def _run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The flow or task run's logger (the conversion shows in the run's log), else this module's."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logger


def is_terminal_bench_task(path: Path) -> bool:
    return (path / "task.yaml").is_file() and not (path / "task.toml").exists()


def content_digest(folder: Path) -> str:
    """Of every file's relative path and bytes: a changed task is converted again."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def as_harbor_task(source: Path) -> Path:
    """The Harbor-format copy of the Terminal-Bench task ``source`` (same folder name), converting it if needed."""
    from harbor.mappers.terminal_bench import TerminalBenchMapper

    home = cache_root() / "terminal-bench" / f"{source.name}-{content_digest(source)[:16]}"
    target = home / source.name
    if (target / "task.toml").is_file():
        return target
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=home, prefix=".converting-"))
    try:
        # The single-task path `harbor tasks migrate` itself takes.
        TerminalBenchMapper()._map_task(source, staging / source.name)
        try:
            os.rename(staging / source.name, target)
        except OSError:  # a concurrent row converted it first
            if not (target / "task.toml").is_file():
                raise
        else:
            _run_logger().info(f"Converted Terminal-Bench task {source.name} (task.yaml) with Harbor's TerminalBenchMapper into {target}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
