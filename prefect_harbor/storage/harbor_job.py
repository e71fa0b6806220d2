"""A run folder as Harbor's job folder, so that ``harbor view <results root>`` shows every sweep.

Harbor's viewer (``harbor/viewer/scanner.py``) takes each folder under the root it is given
as a job: ``<job>/config.json`` (a :class:`JobConfig`: agent, model, environment, tasks),
``<job>/result.json`` (a :class:`JobResult`: counts, rewards, tokens and cost), and every
sub-folder holding a trial's ``config.json`` or ``result.json`` as a trial. Each attempt's
archive is its trial's folder, named after the trial (``storage/archive.py``), so the viewer
finds them; these two files, written in Harbor 0.25's own models, give it the job.

The figures are Harbor's own, computed as ``Job.run`` computes them from the same trials: its
``Mean`` metric over each trial's verifier rewards (a trial with none counts 0, Harbor's rule),
the counts of completed, errored and cancelled trials, and the token and cost totals. pass@k is
the sweep's, a row being one problem (Harbor groups by task; they agree when each task is one row).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from harbor.metrics.mean import Mean
from harbor.models.job.config import DatasetConfig, JobConfig
from harbor.models.job.result import AgentDatasetStats, JobResult, JobStats
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig

from prefect_harbor.scoring import counted_value
from prefect_harbor.stats.summary import summarize
from prefect_harbor.storage.manifest import RunManifest, now

if TYPE_CHECKING:
    from prefect_harbor.spec import BackendSpec

JOB_CONFIG = "config.json"
JOB_RESULT = "result.json"
#: What Harbor names a trial's source when its task came from no dataset (ours: each row's own task copy).
SOURCE = "adhoc"
#: The results columns the job result reads.
COLUMNS = ("row_id", "attempt", "agent", "model", "status", "reward", "rewards", "trial_name", "exception_type", "err_category",
           "err_phase", "err_message", "failure_cause", "input_tokens", "cached_tokens", "output_tokens", "cost_usd")  # fmt: skip


def job_config(config: BackendSpec, name: str, root: str, model: str | None) -> JobConfig:
    """The sweep as Harbor's job configuration: its name (the Prefect run's, which names the backend and the dataset:
    the viewer lists the job under its folder, the run id), agent and model, trials at once, attempts, environment and tasks."""
    environment = config.environment
    tasks, mode = config.sources.tasks_dir, config.sources.mode
    return JobConfig(
        job_name=name, jobs_dir=Path(root.removeprefix("file://")) if "://" not in root.removeprefix("file://") else Path("jobs"), n_attempts=config.limits.attempts,
        n_concurrent_trials=config.limits.n_concurrent, agents=[AgentConfig(name=config.agent_name, model_name=model)],
        environment=EnvironmentConfig(type=environment.type, import_path=environment.import_path, kwargs=dict(environment.kwargs)),
        datasets=[DatasetConfig(path=tasks)] if mode == "dataset" else [], tasks=[TaskConfig(path=tasks)] if mode == "template" else [],
    )  # fmt: skip


def started_job(manifest: RunManifest, trials: int) -> JobResult:
    """The job as it starts: ``trials`` to run, none done."""
    return JobResult(
        id=job_id(manifest), started_at=manifest.started_at, updated_at=now(), n_total_trials=trials, stats=JobStats.from_counts(n_total_trials=trials)
    )


def finished_job(manifest: RunManifest, table: pa.Table, attempts: int) -> JobResult:
    """The job as it ended, from the run's results (one row per trial, kept ones of a resumed run included)."""
    records = table.select([name for name in COLUMNS if name in table.column_names]).to_pylist()
    stats = JobStats(
        n_completed_trials=len(records),
        n_errored_trials=sum(1 for r in records if r["status"] != "success"),
        n_cancelled_trials=sum(1 for r in records if r["status"] == "cancelled"),
    )
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[JobStats.format_agent_evals_key(record.get("agent") or "agent", record.get("model"), SOURCE)].append(record)
        for name, field in (("input_tokens", "n_input_tokens"), ("cached_tokens", "n_cache_tokens"), ("output_tokens", "n_output_tokens"), ("cost_usd", "cost_usd")):
            if record.get(name) is not None:
                setattr(stats, field, (getattr(stats, field) or 0) + record[name])
    stats.evals = {key: _eval_stats(group, attempts) for key, group in groups.items()}
    return JobResult(
        id=job_id(manifest), started_at=manifest.started_at, updated_at=manifest.finished_at or now(), finished_at=manifest.finished_at,
        n_total_trials=len(records), stats=stats,
    )  # fmt: skip


def _eval_stats(records: list[dict[str, Any]], attempts: int) -> AgentDatasetStats:
    """One agent and model's trials, as Harbor's ``JobStats.increment`` and ``Job.run`` count them."""
    stats = AgentDatasetStats()
    rewards: list[dict[str, float] | None] = []
    for record in records:
        name = record.get("trial_name") or f"{record['row_id']} #{record.get('attempt') or 1}"
        verified = dict(record.get("rewards") or [])
        if counted_value(record) is not None:  # Harbor's Mean counts None as 0: give it what the contract counts
            rewards.append(verified or None)
        if verified:
            stats.n_trials += 1
            for key, value in verified.items():
                stats.reward_stats.setdefault(key, {}).setdefault(value, []).append(name)
        if record["status"] != "success":
            stats.n_errors += 1
            stats.exception_stats.setdefault(record.get("exception_type") or record.get("err_category") or record["status"], []).append(name)
    stats.metrics = [Mean().compute(rewards)] if rewards else []  # nothing counted: no mean (Harbor's Mean divides by zero)
    stats.pass_at_k = summarize(records, attempts).pass_at_k
    return stats


def job_id(manifest: RunManifest) -> uuid.UUID:
    """The job's id: the flow run's, or one derived from the run id."""
    try:
        return uuid.UUID(manifest.flow_run_id or "")
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_URL, manifest.run_id)


def to_json(model: JobConfig | JobResult) -> bytes:
    """As Harbor writes them: its config without defaults, its result without the trial results (each trial has its own)."""
    if isinstance(model, JobConfig):
        return model.model_dump_json(indent=4, exclude_defaults=True).encode()
    return model.model_dump_json(indent=4, exclude={"trial_results"}).encode()
