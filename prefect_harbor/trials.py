"""One dataset row -> one Harbor trial -> one :class:`RowResult`, the Osmosis way.

Nothing here knows about Prefect: the Prefect task in ``tasks/`` wraps
:func:`run_row`, and the benchmark calls it directly as the no-Prefect baseline.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.result import TimingInfo, TrialResult
from harbor.trial.trial import Trial

from prefect_harbor.config import SweepConfig
from prefect_harbor.results import ErrorCategory, RowResult
from prefect_harbor.rows import DatasetRow, RowProblem

_TIMEOUT_EXCEPTIONS = frozenset(
    {"AgentTimeoutError", "AgentSetupTimeoutError", "VerifierTimeoutError", "EnvironmentStartTimeoutError", "TimeoutError"}
)


class RowRejected(Exception):
    """A row that cannot become a trial; it is recorded as a failure with this reason."""

    def __init__(self, message: str, category: ErrorCategory = "validation_error"):
        super().__init__(message)
        self.category = category


@dataclass(frozen=True)
class RunContext:
    """Where one sweep run keeps its local trial directories."""

    run_id: str
    trials_dir: Path

    @property
    def tasks_copy_dir(self) -> Path:
        return self.trials_dir / "_tasks"


def trial_name_for(row_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", row_id).strip("._")[:80] or "row"
    return f"{safe}__{uuid.uuid4().hex[:7]}"


def prepare_task(row: DatasetRow, config: SweepConfig, destination: Path) -> tuple[str, Path]:
    """Copy the row's task to ``destination`` (a private copy per row); return (task, path)."""
    if config.task_mode == "dataset":
        task_id = row.task_id
        if not task_id:
            raise RowRejected("dataset mode needs metadata.harbor_task_id (a task directory under tasks_dir)")
        source = (config.tasks_dir / task_id).resolve()
        if not source.is_relative_to(config.tasks_dir) or not source.is_dir() or source == config.tasks_dir:
            raise RowRejected(f"unknown harbor task id {task_id!r} (no such directory under {config.tasks_dir})")
        task = task_id
    else:
        source, task = config.tasks_dir, config.tasks_dir.name
    for path in [source, *source.rglob("*")]:
        if path.is_symlink():
            raise RowRejected(f"task {task!r} contains a symlink ({path.relative_to(source)}); tasks must be plain files")
    shutil.copytree(source, destination)
    if config.task_mode == "template":
        instruction = destination / "instruction.md"
        if row.prompt:
            # Byte-for-byte what the Osmosis backend writes: one line, ASCII-escaped.
            instruction.write_text(json.dumps(row.prompt, default=str))
        elif not instruction.is_file():
            raise RowRejected(f"task {task} has no instruction and no prompt")
    return task, destination


def build_trial_config(config: SweepConfig, task_path: Path, run: RunContext, trial_name: str) -> TrialConfig:
    if ":" in config.agent:
        agent = AgentConfig(import_path=config.agent, model_name=config.model_name)
    else:
        agent = AgentConfig(name=config.agent, model_name=config.model_name)
    environment = config.environment
    return TrialConfig(
        task=TaskConfig(path=task_path),
        trials_dir=run.trials_dir,
        trial_name=trial_name,
        agent=agent,
        environment=EnvironmentConfig(type=environment.type, import_path=environment.import_path, kwargs=environment.kwargs),
    )


async def run_row(row: DatasetRow | RowProblem, index: int, config: SweepConfig, run: RunContext) -> RowResult:
    """Run one row's trial. Returns a result for every outcome except cancellation."""
    base = RowResult(row_index=index, row_id=row.id, agent=config.agent, model=config.model_name, status="failure")
    if isinstance(row, RowProblem):
        return base.model_copy(update={"err_category": "validation_error", "err_message": row.reason, "err_phase": "setup"})
    trial_name = trial_name_for(row.id)
    started = datetime.now().astimezone()
    try:
        task, task_path = await asyncio.to_thread(prepare_task, row, config, run.tasks_copy_dir / trial_name)
        base = base.model_copy(update={"task": task, "trial_name": trial_name})
        trial = await Trial.create(build_trial_config(config, task_path, run, trial_name))
    except RowRejected as rejected:
        return _failed(base, rejected.category, str(rejected), started)
    except Exception as error:  # Trial.create raises whatever the task or environment raised
        return _failed(base, "validation_error", f"{type(error).__name__}: {error}", started, type(error).__name__)
    result = await trial.run()
    row_result = outcome(base, result)
    trial_dir = run.trials_dir / trial_name
    if row_result.status == "success" and config.cleanup_successful_trials:
        await asyncio.to_thread(_remove, trial_dir, run.tasks_copy_dir / trial_name)
    else:
        row_result.trial_dir = str(trial_dir)
    return row_result


def _failed(base: RowResult, category: ErrorCategory, message: str, started: datetime, exception_type: str | None = None) -> RowResult:
    return base.model_copy(
        update={
            "err_category": category,
            "err_message": message,
            "err_phase": "setup",
            "exception_type": exception_type,
            "started_at": started,
            "finished_at": datetime.now().astimezone(),
        }
    )


def outcome(base: RowResult, result: TrialResult) -> RowResult:
    """Map a TrialResult to a row result with the Osmosis backend's precedence.

    An exception raised before the verifier started stays the reported cause; then the
    verifier's ``reward`` key decides; a trial with neither has no reward source.
    """
    error = result.exception_info
    rewards = dict((result.verifier_result.rewards or {}) if result.verifier_result else {})
    fields = {
        "rewards": {key: float(value) for key, value in rewards.items() if isinstance(value, int | float)},
        "exception_type": error.exception_type if error else None,
        "err_phase": failure_phase(result),
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        **_timings(result),
        **_metrics(result),
    }
    if error is not None and error.exception_type == "CancelledError":
        return base.model_copy(update={**fields, "status": "cancelled", "err_message": "cancelled"})
    agent_error = agent_phase_failure(result)
    if agent_error is not None:
        return base.model_copy(update={**fields, "err_category": _category(agent_error.exception_type), "err_message": agent_error.exception_message})
    if result.verifier_result is not None:
        reward = rewards.get("reward")
        if reward is None:
            message = f"Sample has no reward after grading (the verifier wrote {sorted(rewards)}; only 'reward' counts)"
            return base.model_copy(update={**fields, "err_category": "validation_error", "err_message": message, "err_phase": "grading"})
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            return base.model_copy(update={**fields, "err_category": "validation_error", "err_message": f"reward must be a finite number, got {reward!r}", "err_phase": "grading"})
        return base.model_copy(update={**fields, "status": "success", "reward": float(reward), "err_phase": None})
    if error is not None:
        return base.model_copy(update={**fields, "err_category": _category(error.exception_type), "err_message": error.exception_message})
    message = "trial ended with no verifier result and no recorded error; the task has no reward source (no tests/ and no grader)"
    return base.model_copy(update={**fields, "err_category": "validation_error", "err_message": message, "err_phase": "grading"})


def agent_phase_failure(result: TrialResult):
    """The recorded exception, when it struck before verification started."""
    error = result.exception_info
    if error is None:
        return None
    verifier_started = result.verifier.started_at if result.verifier else None
    if verifier_started is None or error.occurred_at < verifier_started:
        return error
    return None


def failure_phase(result: TrialResult) -> str:
    spans = [
        ("verifier", result.verifier),
        ("agent", result.agent_execution),
        ("agent_setup", result.agent_setup),
        ("environment_setup", result.environment_setup),
    ]
    if agent_phase_failure(result) is not None:
        spans = spans[1:]
    return next((name for name, span in spans if span is not None), "setup")


def _category(exception_type: str) -> ErrorCategory:
    return "timeout" if exception_type in _TIMEOUT_EXCEPTIONS else "agent_error"


def _seconds(span: TimingInfo | TrialResult | None) -> float | None:
    if span is None or span.started_at is None or span.finished_at is None:
        return None
    return round(max(0.0, (span.finished_at - span.started_at).total_seconds()), 3)


def _timings(result: TrialResult) -> dict[str, float | None]:
    return {
        "environment_setup_sec": _seconds(result.environment_setup),
        "agent_setup_sec": _seconds(result.agent_setup),
        "agent_sec": _seconds(result.agent_execution),
        "verifier_sec": _seconds(result.verifier),
        "total_sec": _seconds(result),
    }


def _metrics(result: TrialResult) -> dict[str, float | int | None]:
    context = result.agent_result
    if context is None:
        return {}
    return {
        "input_tokens": context.n_input_tokens,
        "cached_tokens": context.n_cache_tokens,
        "output_tokens": context.n_output_tokens,
        "cost_usd": context.cost_usd,
    }


def _remove(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
