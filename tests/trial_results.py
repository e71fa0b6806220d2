"""Real Harbor ``TrialResult``s for the outcome tests: every required field set, as a trial writes them."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from harbor.models.task.id import LocalTaskId
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.models.trial.result import AgentInfo, ExceptionInfo, ModelInfo, TrialResult


def exception_info(exception_type: str, occurred_at: datetime, message: str | None = None) -> ExceptionInfo:
    return ExceptionInfo(exception_type=exception_type, exception_message=message or f"{exception_type} happened", exception_traceback="", occurred_at=occurred_at)


def trial_result(task: str = "t", trial: str = "t__1", agent: str = "oracle", trial_uri: str | None = None, **fields: Any) -> TrialResult:
    """A validated TrialResult of ``task`` (under ``/tasks``) by ``agent``; ``fields`` set the rest."""
    return TrialResult(
        task_name=task, trial_name=trial, trial_uri=trial_uri or f"file:///nowhere/{trial}", task_id=LocalTaskId(path=Path(f"/tasks/{task}")),
        task_checksum="0", config=TrialConfig(task=TaskConfig(path=Path(f"/tasks/{task}"))),
        agent_info=AgentInfo(name=agent, version="1", model_info=ModelInfo(name="m", provider="p")), **fields,
    )  # fmt: skip
