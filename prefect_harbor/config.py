"""The sweep's configuration, validated before any trial starts.

These pydantic models are what the CLI builds from its flags and what the flow takes as
typed parameters (so Prefect renders them as a form). A configuration error names the
field and the fix, and is raised before the first trial.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from prefect_harbor.sandbox import IMPORT_PATH as SANDBOX_IMPORT_PATH

TaskMode = Literal["template", "dataset"]
NATIVE_AGENTS = ("oracle", "terminus-2", "mini-swe-agent")


class ConfigurationError(ValueError):
    """The sweep cannot start; the message names the field and what to do."""


class TrialEnvironment(BaseModel):
    """Where trials run: the local bubblewrap sandbox, or any Harbor environment."""

    type: str | None = Field(default=None, description="A Harbor environment type (docker, daytona, modal, ...).")
    import_path: str | None = Field(
        default=SANDBOX_IMPORT_PATH, description="A 'module:Class' Harbor environment; the local sandbox by default."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Options passed to the environment.")

    @model_validator(mode="after")
    def _one_kind(self) -> TrialEnvironment:
        if self.type and self.import_path == SANDBOX_IMPORT_PATH:
            self.import_path = None  # choosing a type replaces the default sandbox
        if bool(self.type) == bool(self.import_path):
            raise ConfigurationError("environment: set exactly one of `type` or `import_path`.")
        return self


def default_trials_dir() -> str:
    return str(Path(tempfile.gettempdir()) / "prefect-harbor" / "trials")


class SweepConfig(BaseModel):
    """Everything a sweep needs besides the dataset."""

    tasks_dir: Path = Field(description="Template mode: one task directory. Dataset mode: a root of task directories.")
    task_mode: TaskMode = Field(default="dataset", description="'template': the row's prompt becomes instruction.md; 'dataset': metadata.harbor_task_id picks the task.")
    agent: str = Field(default="oracle", description="A native Harbor agent name, or 'module:Class'.")
    model_name: str | None = Field(default=None, description="Model for model-backed agents.")
    concurrency: int = Field(default=4, ge=1, le=256, description="Trials running at once.")
    results: str = Field(default="results", description="Results root: a local path or an fsspec URL (s3://...).")
    trials_dir: str = Field(default_factory=default_trials_dir, description="Local directory for Harbor trial directories.")
    cleanup_successful_trials: bool = Field(default=True, description="Delete a successful row's local trial directory.")
    environment: TrialEnvironment = Field(default_factory=TrialEnvironment)

    @field_validator("tasks_dir")
    @classmethod
    def _tasks_dir_exists(cls, value: Path) -> Path:
        value = value.expanduser()
        if not value.is_dir():
            raise ConfigurationError(f"tasks_dir: {value} is not a directory; point it at a Harbor task (template mode) or a folder of tasks (dataset mode).")
        return value.resolve()

    @model_validator(mode="after")
    def _tasks_dir_fits_the_mode(self) -> SweepConfig:
        is_task = (self.tasks_dir / "task.toml").is_file()
        if self.task_mode == "template" and not is_task:
            raise ConfigurationError(f"tasks_dir: {self.tasks_dir} has no task.toml; template mode needs one Harbor task directory.")
        if self.task_mode == "dataset":
            if is_task:
                raise ConfigurationError(f"tasks_dir: {self.tasks_dir} is a single task; use --mode template, or point tasks_dir at its parent folder.")
            if not any((child / "task.toml").is_file() for child in self.tasks_dir.iterdir()):
                raise ConfigurationError(f"tasks_dir: {self.tasks_dir} holds no task directories (sub-folders with task.toml).")
        return self

    @field_validator("agent")
    @classmethod
    def _agent_is_known(cls, value: str) -> str:
        if ":" not in value and value not in NATIVE_AGENTS:
            raise ConfigurationError(f"agent: unknown native agent {value!r}; registered: {list(NATIVE_AGENTS)} (or give 'module:Class').")
        return value
