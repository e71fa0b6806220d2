"""The results table: one row per dataset row, written as Parquet under an fsspec URL.

Layout under the results root::

    <root>/<run_id>/parts/part-000042.parquet   one file per finished row, written at once
    <root>/<run_id>/results.parquet             all rows, written when the sweep ends

While a sweep runs (or after it crashed) ``pyarrow.parquet.read_table(<run>/parts)``
reads every finished row; when it ends, the parts are compacted into
``results.parquet`` and removed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime
from typing import Any, Literal

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
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
    trial_name: str | None = None
    trial_dir: str | None = Field(default=None, description="Local trial directory, when it was kept.")
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
        ("trial_name", pa.string()),
        ("trial_dir", pa.string()),
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


class ResultsWriter:
    """Writes one sweep run's results under ``<root>/<run_id>/``."""

    def __init__(self, root: str, run_id: str, storage_options: dict[str, Any] | None = None):
        self.fs, root_path = fsspec.core.url_to_fs(root, **(storage_options or {}))
        self.run_path = f"{root_path.rstrip('/')}/{run_id}"
        self.parts_path = f"{self.run_path}/parts"
        self.results_path = f"{self.run_path}/results.parquet"
        self.fs.makedirs(self.parts_path, exist_ok=True)

    def uri(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def write_row(self, result: RowResult) -> str:
        """Persist one finished row at once, so a crash later loses nothing."""
        path = f"{self.parts_path}/part-{result.row_index:06d}.parquet"
        pq.write_table(to_table([result]), path, filesystem=self.fs)
        return self.uri(path)

    def finalize(self, results: list[RowResult]) -> str:
        """Write every row into ``results.parquet``, then drop the parts it replaces."""
        ordered = sorted(results, key=lambda result: result.row_index)
        pq.write_table(to_table(ordered), self.results_path, filesystem=self.fs)
        self.fs.rm(self.parts_path, recursive=True)
        return self.uri(self.results_path)


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

    @classmethod
    def of(cls, run_id: str, results_uri: str, results: list[RowResult]) -> SweepSummary:
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
        )


def _mean(results: list[RowResult]) -> float | None:
    rewards = [r.reward for r in results if r.reward is not None and math.isfinite(r.reward)]
    return sum(rewards) / len(rewards) if rewards else None
