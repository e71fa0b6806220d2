"""A run's statistics from its results table: what a paper would print about a sweep.

Computed from the results rows (one per row and attempt), so the same figures come out of a
running sweep's end, ``summary.json``, ``prefect-harbor compare`` and any old run folder:

- the mean reward under the scoring contract (``prefect_harbor/scoring.py``: scored attempts,
  agent failures as 0, the rest not scored and counted by cause), with its 95% interval;
- pass@k for k = 1 … attempts, a row being one problem: Harbor's rule, where an attempt that
  finished without a reward counts as not passed and rewards must be 0 or 1; cancelled
  attempts did not finish and count for neither;
- input (cached included, as Harbor counts it), cached and output tokens and cost, summed over
  every attempt, whatever its outcome: failures cost too;
- the same per task, and how many attempts had their verifier's output flagged as tampered with.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, Field

from prefect_harbor.scoring import scoring_of
from prefect_harbor.stats.estimators import Estimate, clustered_mean, pass_at_k_curve

#: The results columns the statistics read (``attempt`` and ``verifier_tampering`` may be absent: older runs).
COLUMNS = (
    "row_id", "attempt", "task", "status", "reward", "err_category", "err_phase", "err_message", "failure_cause",
    "input_tokens", "cached_tokens", "output_tokens", "cost_usd", "verifier_tampering",
)  # fmt: skip
#: Counted as a pass by pass@k: Harbor's binary reward.
PASS = 1.0
NO_TASK = "(none)"


class Tokens(BaseModel):
    """Usage summed over attempts, as Harbor's ``TrialResult.compute_token_cost_totals`` sums a trial's steps."""

    input_tokens: int | None = Field(default=None, description="Input tokens, cached ones included (Harbor's n_input_tokens).")
    cached_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None

    def add(self, record: Mapping[str, Any]) -> None:
        for name in ("input_tokens", "cached_tokens", "output_tokens", "cost_usd"):
            value = record.get(name)
            if value is not None:
                setattr(self, name, (getattr(self, name) or 0) + value)


class Figures(BaseModel):
    """The figures of a set of rows: the whole run, or one task."""

    rows: int = Field(description="Dataset rows.")
    trials: int = Field(description="Result rows: one per row and attempt.")
    scored: int = Field(description="Attempts with a reward.")
    agent_failures: int = Field(default=0, description="Attempts the agent failed before a reward: counted as 0 in the mean.")
    not_scored: dict[str, int] = Field(default_factory=dict, description="Attempts that measured nothing of the agent, by cause: left out of the mean.")
    reward: Estimate | None = Field(description="Mean reward over scored attempts and agent failures (as 0), with its 95% interval.")
    pass_at_k: dict[int, float] = Field(default_factory=dict, description="pass@k, k = 1 … attempts; empty when rewards are not all 0 or 1.")
    tokens: Tokens = Field(default_factory=Tokens)


class RunStatistics(Figures):
    """The run's figures, overall and per task."""

    attempts: int = Field(description="Attempts per row.")
    pass_at_k_note: str | None = Field(default=None, description="Why pass@k is not given, when it is not.")
    verifier_flagged: int = Field(default=0, description="Attempts whose verifier output was flagged as tampered with.")
    per_task: dict[str, Figures] = Field(default_factory=dict)


@dataclass
class _Row:
    """One row's attempts, as the statistics need them."""

    task: str = NO_TASK
    trials: int = 0
    #: What the mean counts of each attempt: its reward, or 0 for an agent failure.
    counted: list[float] = field(default_factory=list)
    scored: int = 0
    agent_failures: int = 0
    not_scored: Counter[str] = field(default_factory=Counter)
    finished: int = 0
    passes: int = 0
    non_binary: float | None = None
    tokens: Tokens = field(default_factory=Tokens)

    def add(self, record: Mapping[str, Any]) -> None:
        self.trials += 1
        self.tokens.add(record)
        if record.get("task"):
            self.task = str(record["task"])
        if record["status"] == "cancelled":
            return
        self.finished += 1
        scoring, cause = scoring_of(record)
        if scoring == "agent_failure":
            self.agent_failures += 1
            self.counted.append(0.0)
        elif scoring == "not_scored":
            self.not_scored[cause or "unknown"] += 1
        reward = record.get("reward")
        if reward is None:
            return
        self.scored += 1
        self.counted.append(float(reward))
        self.passes += reward == PASS
        if reward not in (0.0, PASS) and self.non_binary is None:
            self.non_binary = float(reward)


def figures_of(rows: list[_Row], max_k: int) -> tuple[Figures, str | None]:
    """The figures of ``rows``, and why pass@k is not given when it is not."""
    non_binary = next((row.non_binary for row in rows if row.non_binary is not None), None)
    note: str | None
    if non_binary is not None:
        curve, note = {}, f"pass@k needs rewards of 0 or 1 (Harbor's rule); this run has others, e.g. {non_binary:g}"
    else:
        curve = pass_at_k_curve([(row.finished, row.passes) for row in rows], max_k)
        note = None if curve else "no attempt finished"
    tokens, not_scored = Tokens(), Counter[str]()
    for row in rows:
        tokens.add(row.tokens.model_dump())
        not_scored.update(row.not_scored)
    figures = Figures(
        rows=len(rows), trials=sum(row.trials for row in rows), scored=sum(row.scored for row in rows),
        agent_failures=sum(row.agent_failures for row in rows), not_scored=dict(sorted(not_scored.items())),
        reward=clustered_mean([row.counted for row in rows]), pass_at_k=curve, tokens=tokens,
    )  # fmt: skip
    return figures, note


def summarize(records: Iterable[Mapping[str, Any]], attempts: int | None = None) -> RunStatistics:
    """The run's statistics from its result rows (dicts with the results table's columns).

    ``attempts``: attempts per row as configured (default: the most any row has)."""
    rows: dict[str, _Row] = defaultdict(_Row)
    flagged, most = 0, 1
    for record in records:
        rows[str(record["row_id"])].add(record)
        most = max(most, int(record.get("attempt") or 1))
        flagged += _flagged(record.get("verifier_tampering"))
    attempts = attempts or most
    by_task: dict[str, list[_Row]] = defaultdict(list)
    for row in rows.values():
        by_task[row.task].append(row)
    overall, note = figures_of(list(rows.values()), attempts)
    per_task = {task: figures_of(task_rows, attempts)[0] for task, task_rows in sorted(by_task.items())}
    return RunStatistics(**dict(overall), attempts=attempts, pass_at_k_note=note, verifier_flagged=flagged, per_task=per_task)


def summarize_table(table: pa.Table, attempts: int | None = None) -> RunStatistics:
    """:func:`summarize` over a results table (an older run's lacks ``attempt``: one attempt per row)."""
    present = [name for name in COLUMNS if name in table.column_names]
    return summarize(table.select(present).to_pylist(), attempts)


def _flagged(value: Any) -> bool:
    """Whether a ``verifier_tampering`` cell flags the attempt: any non-empty value but false."""
    return value is not None and value is not False and value not in ("", [], {})
