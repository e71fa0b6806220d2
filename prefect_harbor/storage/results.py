"""The results table: one row per dataset row and attempt, with a stable Parquet schema.

Where the table is written (incrementally, then compacted) is ``storage.RunStore``'s job.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefect_harbor.bounds import bounded
from prefect_harbor.outcome import Counts, figure, table_row
from prefect_harbor.scoring import scoring_of
from prefect_harbor.stats.compare import Comparison
from prefect_harbor.stats.render import headline_figures
from prefect_harbor.stats.summary import RunStatistics

RowStatus = Literal["success", "failure", "cancelled"]
#: Osmosis's three, plus ``verifier_error``: the verifier failed or wrote a reward Harbor's
#: contract does not allow (so the row is not a scored 0, and the agent is not blamed); and
#: ``verifier_tampering``: evidence that the agent tampered with its verifier, with the
#: backend's ``on_tampering = "fail"``.
ErrorCategory = Literal["timeout", "validation_error", "agent_error", "verifier_error", "verifier_tampering"]


#: The row's messages: repeated in logs, states and archives, so bounded (:func:`~prefect_harbor.bounds.bounded`).
_BOUNDED = frozenset({"err_message", "archive_error"})


class RowResult(BaseModel):
    """The outcome of one attempt at a dataset row (one execution, at most one scalar reward)."""

    model_config = ConfigDict(validate_assignment=True)

    row_index: int
    row_id: str
    attempt: int = Field(default=1, description="Which of the row's attempts this is, from 1 (the backend's attempts).")
    tries: int = Field(default=1, description="Trials the attempt took: more than 1 when a not-scored trial (its sandbox or the model endpoint failed) was tried again.")
    task: str | None = None
    agent: str | None = None
    model: str | None = None
    status: RowStatus
    reward: float | None = Field(default=None, description="The verifier's 'reward' key; null when none.")
    rewards: dict[str, float] = Field(default_factory=dict, description="Every key the verifier wrote.")
    err_category: ErrorCategory | None = None
    err_message: str | None = None
    err_phase: str | None = Field(default=None, description="The phase the failure belongs to.")
    exception_type: str | None = Field(default=None, description="The name of the exception that ended the trial (Harbor's, or the setup's).")
    verifier_mode: str | None = Field(
        default=None,
        description="Where the verifier ran, as Harbor resolved it: 'shared' (in the agent's sandbox) or 'separate'; null when the trial never got that far or has steps.",
    )
    failure_cause: str | None = Field(
        default=None, description="Harbor's cause for that exception (its error policy: sandbox_failed, model_provider_failed, agent_exhausted_budget, verifier_failed, ...)."
    )
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
    host: str | None = Field(
        default=None, description="The machine whose process ran the attempt (its trial, or the check that refused it); null when it never reported."
    )
    trial_name: str | None = None
    trial_dir: str | None = Field(default=None, description="Local trial directory, when it was kept.")
    artifact_uri: str | None = Field(default=None, description="Where the row's archive (logs, artifacts, diagnostics) is.")
    archive_error: str | None = Field(default=None, description="Why the row's archive is missing or incomplete; the outcome stands.")
    certification: str | None = Field(
        default=None, description="The task's certification for its content (prefect-harbor certify): verdict, digest and counts; null when none exists."
    )
    verifier_tampering: list[str] | None = Field(
        default=None, description="Evidence that the agent tampered with its verifier, a short line each; empty when checked and clean, null when not checked."
    )
    hosts_tried: list[str] | None = Field(
        default=None,
        description="Where the trial tried to go, in order: 'host:port' (a name asked of a no-network or allowlist trial's proxy, "
        "'(refused: why)' after those refused; an address a public trial connected to, '/udp' for UDP); empty when nowhere; null when not observed.",
    )
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @field_validator(*_BOUNDED)
    @classmethod
    def _bounded(cls, text: str | None) -> str | None:
        """At most a few KiB (its end, saying how much was cut): the results, logs and states repeat it."""
        return bounded(text)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> RowResult:
        """Pydantic's copy, with the updated messages bounded as construction bounds them."""
        copy = super().model_copy(update=update, deep=deep)
        for name in _BOUNDED.intersection(update or ()):
            object.__setattr__(copy, name, bounded(getattr(copy, name)))
        return copy

    def __repr__(self) -> str:
        """Short: Prefect prints a task run's result in its final-state log line."""
        return f"RowResult(row_id={self.row_id!r}, status={self.status!r}, reward={self.reward!r})"


#: Arrow's type for each Python type a result field holds.
_ARROW_SCALARS: dict[Any, pa.DataType] = {int: pa.int64(), float: pa.float64(), str: pa.string(), datetime: pa.timestamp("us", tz="UTC")}


def arrow_type(annotation: Any) -> pa.DataType:
    """The Parquet column type of a :class:`RowResult` field: every column is nullable, so ``X | None``
    is ``X``; a ``Literal`` of strings is a string."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, UnionType):
        (inner,) = [arg for arg in args if arg is not type(None)]
        return arrow_type(inner)
    if origin is Literal and all(isinstance(arg, str) for arg in args):
        return pa.string()
    if origin is dict:
        return pa.map_(arrow_type(args[0]), arrow_type(args[1]))
    if origin is list:
        return pa.list_(arrow_type(args[0]))
    if annotation in _ARROW_SCALARS:
        return _ARROW_SCALARS[annotation]
    raise TypeError(f"RowResult field type {annotation!r} has no Parquet column type: add it to results.arrow_type.")


#: The stable Parquet schema of the results table (documented in the README's Results section), one column per field of the model.
RESULTS_SCHEMA = pa.schema([(name, arrow_type(field.annotation)) for name, field in RowResult.model_fields.items()])


def to_table(results: list[RowResult]) -> pa.Table:
    records: list[dict[str, Any]] = []
    for result in results:
        record = result.model_dump()
        record["rewards"] = list(record["rewards"].items())
        records.append(record)
    return pa.Table.from_pylist(records, schema=RESULTS_SCHEMA)


class TaskScore(BaseModel):
    rows: int = Field(description="Dataset rows of this task.")
    trials: int = Field(default=0, description="Result rows: one per row and attempt; success, failure and cancelled count them.")
    mean_reward: float | None = Field(description="Mean reward under the scoring contract: scored attempts, agent failures as 0.")
    success: int = 0
    failure: int = 0
    cancelled: int = 0
    agent_failures: int = 0
    not_scored: int = 0


class SweepSummary(BaseModel):
    """What a sweep prints and returns; ``results_uri`` is where the table is."""

    run_id: str
    results_uri: str
    rows: int = Field(description="Dataset rows the run holds results for.")
    trials: int = Field(default=0, description="Result rows: one per row and attempt; success, failure and cancelled count them.")
    success: int
    failure: int
    cancelled: int
    mean_reward: float | None = Field(description="Mean reward under the scoring contract (prefect_harbor/scoring.py): scored attempts, agent failures as 0.")
    scored: int = Field(default=0, description="Attempts with a reward.")
    agent_failures: int = Field(default=0, description="Attempts the agent failed before a reward: counted as 0 in the mean.")
    not_scored: dict[str, int] = Field(default_factory=dict, description="Attempts that measured nothing of the agent, by cause: left out of the mean.")
    rewarded: int = Field(default=0, description="Rows scored above zero.")
    per_task: dict[str, TaskScore]
    verifier_tampering: int = Field(default=0, description="Rows with evidence that the agent tampered with its verifier.")
    local_fallback: str | None = Field(default=None, description="Local folder holding files the storage refused.")
    unsent_files: list[str] = Field(default_factory=list)
    attempts: int = Field(default=1, description="Attempts per row (trials = rows × attempts when every attempt ran).")
    statistics: RunStatistics | None = Field(default=None, description="Intervals, pass@k, tokens and cost, overall and per task (summary.json).")
    comparison: Comparison | None = Field(default=None, description="Against the previous completed sweep of the same deployment and dataset.")
    stopped_early: str | None = Field(default=None, description="Why the stopping rule (stop_at_ci_width) ended the sweep before its last attempt, when it did.")

    def counted(self) -> str:
        """``9 trials (3 rows × 3 attempts): 9 success, 0 failure, 0 cancelled`` (``7 rows: …`` with one attempt)."""
        rows = f"{self.rows} rows" if self.attempts == 1 else f"{self.trials} trials ({self.rows} rows × {self.attempts} attempts)"
        return f"{rows}: {self.success} success, {self.failure} failure, {self.cancelled} cancelled"

    def mean_phrase(self, no_mean: str = "no row was scored") -> str:
        """``mean reward 0.333 over 6 trials, 2 agent failures counted as 0 (95% CI …); 1 not scored (sandbox 1)``:
        the mean and which attempts it counts, as the scoring contract says."""
        not_scored = sum(self.not_scored.values())
        left_out = f"; {not_scored} not scored ({', '.join(f'{cause} {n}' for cause, n in sorted(self.not_scored.items()))})" if not_scored else ""
        if self.mean_reward is None:
            return f"{no_mean}{left_out}"
        unit = "rows" if self.attempts == 1 else "trials"
        failures = f", {self.agent_failures} agent failure{'s' if self.agent_failures != 1 else ''} counted as 0" if self.agent_failures else ""
        counted = self.scored + self.agent_failures
        return f"mean reward {figure(self.mean_reward)} over {counted} {unit}{failures}{headline_figures(self.statistics)}{left_out}"

    def headline(self) -> str:
        """The sweep in one line: the flow run's state message, its last log line, the CLI's summary."""
        counts = self.counted()
        mean = self.mean_phrase()
        compared = f"; {self.comparison.phrase()}" if self.comparison is not None else ""
        tampering = f"; {self.verifier_tampering} with verifier tampering evidence" if self.verifier_tampering else ""
        early = f"; {self.stopped_early}" if self.stopped_early else ""
        return f"{counts}; {mean}{tampering}{early}{compared} — results at {self.results_uri}"

    def counts(self) -> Counts:
        """The sweep's counts, as the flow run's final state names them (``6/7 rewarded, mean 0.857``)."""
        return Counts(rows=self.trials, rewarded=self.rewarded, failed=self.failure, cancelled=self.cancelled, mean_reward=self.mean_reward)


class _Mean:
    """A running mean under the scoring contract, with the counts that say what it counts."""

    __slots__ = ("trials", "rows", "scored", "agent_failures", "total", "statuses", "not_scored")

    def __init__(self) -> None:
        #: Results added, and the dataset rows among them (counted by :class:`RunTally`, which knows a row's first).
        self.trials, self.rows, self.scored, self.agent_failures, self.total = 0, 0, 0, 0, 0.0
        self.statuses: Counter[str] = Counter()
        self.not_scored: Counter[str] = Counter()

    def add(self, result: RowResult, new_row: bool) -> None:
        self.trials += 1
        self.rows += new_row
        self.statuses[result.status] += 1
        scoring, cause = scoring_of(vars(result))
        if scoring == "scored" and result.reward is not None and math.isfinite(result.reward):
            self.scored += 1
            self.total += result.reward
        elif scoring == "agent_failure":
            self.agent_failures += 1
        elif scoring == "not_scored":
            self.not_scored[cause or "unknown"] += 1

    @property
    def mean(self) -> float | None:
        counted = self.scored + self.agent_failures
        return self.total / counted if counted else None


class RunTally:
    """Running totals of a sweep's finished rows: the summary and the report, in memory that
    does not grow with the rows (the rows themselves are in storage).

    Keeps counts, reward sums overall and per task, the first ``failures_kept`` failures of
    each category (the report's examples) and the ``slowest`` longest rows.
    """

    def __init__(self, failures_kept: int = 20, slowest: int = 5, rows_kept: int = 1000):
        self.statuses: Counter[str] = Counter()
        #: Rows with evidence of verifier tampering.
        self.tampered = 0
        #: Rows scored above zero.
        self.rewarded = 0
        self.overall = _Mean()
        self.per_task: dict[str, _Mean] = defaultdict(_Mean)
        self.failures_kept = failures_kept
        self.failure_counts: Counter[str] = Counter()
        self.failures: dict[str, list[RowResult]] = defaultdict(list)
        self._slowest_n = slowest
        self._slowest: list[tuple[float, int, RowResult]] = []
        self.rows_kept = rows_kept
        #: The first ``rows_kept`` rows to finish, as the per-row table artifact shows them.
        self.first_rows: list[dict[str, Any]] = []
        #: One byte per dataset row index, set once a result of that row is added: rows are counted once
        #: whatever their attempts (a megabyte for a million rows; the rows themselves are not kept).
        self._seen = bytearray()

    @property
    def rows(self) -> int:
        """Results added: one per row and attempt (the trials)."""
        return self.statuses.total()

    def add(self, result: RowResult) -> None:
        index = max(result.row_index, 0)
        if index >= len(self._seen):
            self._seen.extend(bytes(max(index + 1 - len(self._seen), len(self._seen))))
        new_row = not self._seen[index]
        self._seen[index] = 1
        self.statuses[result.status] += 1
        self.tampered += bool(result.verifier_tampering)
        self.rewarded += int(result.reward is not None and result.reward > 0)
        if len(self.first_rows) < self.rows_kept:
            self.first_rows.append(table_row(result) | {"index": result.row_index})
        self.overall.add(result, new_row)
        self.per_task[result.task or "(none)"].add(result, new_row)
        if result.status == "failure":
            category = result.err_category or "unknown"
            self.failure_counts[category] += 1
            if len(self.failures[category]) < self.failures_kept:
                self.failures[category].append(result)
        if result.total_sec is not None:
            entry = (result.total_sec, -result.row_index, result)
            if len(self._slowest) < self._slowest_n:
                heapq.heappush(self._slowest, entry)
            elif entry[:2] > self._slowest[0][:2]:
                heapq.heapreplace(self._slowest, entry)

    def slowest(self) -> list[RowResult]:
        """The slowest rows, slowest first."""
        return [result for *_, result in sorted(self._slowest, key=lambda entry: entry[:2], reverse=True)]

    def summary(self, run_id: str, results_uri: str, **extra: Any) -> SweepSummary:
        return SweepSummary(
            run_id=run_id,
            results_uri=results_uri,
            rows=self.overall.rows,
            trials=self.rows,
            success=self.statuses["success"],
            failure=self.statuses["failure"],
            cancelled=self.statuses["cancelled"],
            mean_reward=self.overall.mean,
            scored=self.overall.scored,
            agent_failures=self.overall.agent_failures,
            not_scored=dict(sorted(self.overall.not_scored.items())),
            verifier_tampering=self.tampered,
            rewarded=self.rewarded,
            per_task={
                task: TaskScore(
                    rows=mean.rows, trials=mean.trials, mean_reward=mean.mean, success=mean.statuses["success"], failure=mean.statuses["failure"],
                    cancelled=mean.statuses["cancelled"],
                    agent_failures=mean.agent_failures, not_scored=mean.not_scored.total(),
                )  # fmt: skip
                for task, mean in sorted(self.per_task.items())
            },
            **extra,
        )
