"""The results table: one row per dataset row, with a stable Parquet schema.

Where the table is written (incrementally, then compacted) is ``storage.RunStore``'s job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, Field

RowStatus = Literal["success", "failure", "cancelled"]
ErrorCategory = Literal["timeout", "validation_error", "agent_error"]


class RowResult(BaseModel):
    """The outcome of one dataset row (one execution, at most one scalar reward)."""

    row_index: int
    row_id: str
    task: str | None = None
    agent: str | None = None
    model: str | None = None
    status: RowStatus
    reward: float | None = Field(default=None, description="The verifier's 'reward' key; null when none.")
    rewards: dict[str, float] = Field(default_factory=dict, description="Every key the verifier wrote.")
    err_category: ErrorCategory | None = None
    err_message: str | None = None
    err_phase: str | None = Field(default=None, description="The phase the failure belongs to.")
    exception_type: str | None = None
    environment_setup_sec: float | None = None
    agent_setup_sec: float | None = None
    agent_sec: float | None = None
    verifier_sec: float | None = None
    total_sec: float | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    final_messages: str | None = Field(default=None, description="The sample's final messages as JSON, when there is a sample.")
    trial_name: str | None = None
    trial_dir: str | None = Field(default=None, description="Local trial directory, when it was kept.")
    artifact_uri: str | None = Field(default=None, description="Where the row's archive (logs, artifacts, diagnostics) is.")
    started_at: datetime | None = None
    finished_at: datetime | None = None


#: The stable Parquet schema of the results table (documented in docs/results.md).
RESULTS_SCHEMA = pa.schema(
    [
        ("row_index", pa.int64()),
        ("row_id", pa.string()),
        ("task", pa.string()),
        ("agent", pa.string()),
        ("model", pa.string()),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("rewards", pa.map_(pa.string(), pa.float64())),
        ("err_category", pa.string()),
        ("err_message", pa.string()),
        ("err_phase", pa.string()),
        ("exception_type", pa.string()),
        ("environment_setup_sec", pa.float64()),
        ("agent_setup_sec", pa.float64()),
        ("agent_sec", pa.float64()),
        ("verifier_sec", pa.float64()),
        ("total_sec", pa.float64()),
        ("input_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("final_messages", pa.string()),
        ("trial_name", pa.string()),
        ("trial_dir", pa.string()),
        ("artifact_uri", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
    ]
)
assert RESULTS_SCHEMA.names == list(RowResult.model_fields), "schema and model drifted apart"


def to_table(results: list[RowResult]) -> pa.Table:
    records: list[dict[str, Any]] = []
    for result in results:
        record = result.model_dump()
        record["rewards"] = list(record["rewards"].items())
        records.append(record)
    return pa.Table.from_pylist(records, schema=RESULTS_SCHEMA)


class TaskScore(BaseModel):
    rows: int
    mean_reward: float | None


class SweepSummary(BaseModel):
    """What a sweep prints and returns; ``results_uri`` is where the table is."""

    run_id: str
    results_uri: str
    rows: int
    success: int
    failure: int
    cancelled: int
    mean_reward: float | None = Field(description="Mean 'reward' over rows that have one.")
    per_task: dict[str, TaskScore]
    local_fallback: str | None = Field(default=None, description="Local folder holding files the storage refused.")
    unsent_files: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, run_id: str, results_uri: str, results: list[RowResult], **extra: Any) -> SweepSummary:
        by_task: dict[str, list[RowResult]] = defaultdict(list)
        for result in results:
            by_task[result.task or "(none)"].append(result)
        return cls(
            run_id=run_id,
            results_uri=results_uri,
            rows=len(results),
            success=sum(r.status == "success" for r in results),
            failure=sum(r.status == "failure" for r in results),
            cancelled=sum(r.status == "cancelled" for r in results),
            mean_reward=_mean(results),
            per_task={task: TaskScore(rows=len(rows), mean_reward=_mean(rows)) for task, rows in sorted(by_task.items())},
            **extra,
        )


def _mean(results: list[RowResult]) -> float | None:
    rewards = [r.reward for r in results if r.reward is not None and math.isfinite(r.reward)]
    return sum(rewards) / len(rewards) if rewards else None
