"""Which folders are Harbor tasks: one answer for the block's checks, the preflight and certify.

A Harbor task is a folder holding a ``task.toml`` (Harbor's ``TaskPaths``); a folder of tasks
is a folder whose children are.
"""

from __future__ import annotations

from pathlib import Path

TASK_FILE = "task.toml"


def is_task(folder: Path) -> bool:
    """Whether ``folder`` is a Harbor task (holds a ``task.toml``)."""
    return (folder / TASK_FILE).is_file()


def tasks_in(folder: Path) -> dict[str, Path]:
    """The Harbor tasks directly under ``folder``, by name, in name order."""
    return {child.name: child for child in sorted(folder.iterdir()) if is_task(child)}
