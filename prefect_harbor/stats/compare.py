"""Two runs of the same rows compared: what changed, overall and per task, and how sure we are.

Rows are paired by id. A row's figure in a run is its mean reward over its scored attempts
(as the run's own mean counts them); the difference is ``candidate − baseline`` for every row
scored in both, and its 95% interval is the paired t interval over those rows (each row one
observation: its attempts are already averaged). A row *changed outcome* when its figure moved
or its attempts ended differently: another share of successes, failures and cancels (a success
that became a failure has no figure in one run, and is listed all the same; three successes
where there was one are the same outcome, so runs of different attempts compare).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, Field

from prefect_harbor.stats.estimators import Estimate, clustered_mean
from prefect_harbor.stats.summary import COLUMNS, NO_TASK

#: Differences smaller than this are rounding, not change.
EPSILON = 1e-9


class RowOutcome(BaseModel):
    """A row in one run: its mean reward over scored attempts, and how its attempts ended (``2 success, 1 failure``)."""

    task: str = NO_TASK
    mean: float | None = None
    ended: str = ""
    shares: dict[str, float] = Field(default_factory=dict, exclude=True)

    def ended_like(self, other: RowOutcome) -> bool:
        """Whether the two ended in the same shares (``1 success`` as ``3 success``)."""
        keys = self.shares.keys() | other.shares.keys()
        return all(abs(self.shares.get(k, 0.0) - other.shares.get(k, 0.0)) <= EPSILON for k in keys)


class RowChange(BaseModel):
    row_id: str
    task: str
    baseline: RowOutcome | None = Field(description="The row in the baseline run (none: only the candidate has it).")
    candidate: RowOutcome | None = Field(description="The row in the candidate run (none: only the baseline has it).")
    difference: float | None = Field(default=None, description="candidate − baseline, when both are scored.")


class TaskDifference(BaseModel):
    """One task's paired difference (candidate − baseline) over its rows scored in both runs."""

    rows: int = Field(description="Rows scored in both runs.")
    baseline_mean: float | None = None
    candidate_mean: float | None = None
    difference: Estimate | None = None


class Comparison(BaseModel):
    """``candidate`` against ``baseline``: the paired difference overall and per task, and the rows that changed outcome."""

    baseline: str = Field(description="The baseline run (its folder, or run id).")
    candidate: str
    baseline_started_at: datetime | None = None
    paired_rows: int = Field(description="Rows scored in both runs.")
    only_in_baseline: int = 0
    only_in_candidate: int = 0
    difference: TaskDifference
    per_task: dict[str, TaskDifference] = Field(default_factory=dict)
    changed: list[RowChange] = Field(default_factory=list, description="Rows whose outcome changed, biggest drops first.")

    def worse_tasks(self) -> dict[str, float]:
        """Tasks whose mean dropped, by how much (most first)."""
        drops = {task: d.difference.mean for task, d in self.per_task.items() if d.difference is not None and d.difference.mean < -EPSILON}
        return dict(sorted(drops.items(), key=lambda item: item[1]))

    def newly_failing(self) -> list[str]:
        """Rows with a failed attempt in the candidate and none in the baseline."""
        return [c.row_id for c in self.changed if c.baseline and c.candidate and "failure" in c.candidate.ended and "failure" not in c.baseline.ended]

    def phrase(self, listed: int = 3) -> str:
        """In a few words, for a headline: ``2 tasks worse than the run of 2026-12-01: a −0.5, b −1``."""
        when = f"the run of {self.baseline_started_at:%Y-%m-%d}" if self.baseline_started_at else f"run {self.baseline}"
        worse = self.worse_tasks()
        if worse:
            named = ", ".join(f"{task} {signed(delta)}" for task, delta in list(worse.items())[:listed])
            more = f" and {len(worse) - listed} more" if len(worse) > listed else ""
            text = f"{len(worse)} task{'s' if len(worse) != 1 else ''} worse than {when}: {named}{more}"
        else:
            text = f"no task worse than {when}"
        failing = self.newly_failing()
        if failing:
            text += f"; {len(failing)} row{'s' if len(failing) != 1 else ''} newly failing"
        return text


def signed(value: float) -> str:
    """``+0.25``, ``−0.5`` (a true minus sign): a difference for people, three significant digits."""
    return f"{value:+.3g}".replace("-", "−")


def compare(baseline: Iterable[Mapping[str, Any]], candidate: Iterable[Mapping[str, Any]], baseline_name: str, candidate_name: str) -> Comparison:
    """Compare two runs' result rows (dicts with the results table's columns)."""
    before, after = _rows(baseline), _rows(candidate)
    paired = [row_id for row_id in after if row_id in before]
    by_task: dict[str, list[tuple[float, float]]] = defaultdict(list)
    changed: list[RowChange] = []
    for row_id in paired:
        a, b = before[row_id], after[row_id]
        task = b.task if b.task != NO_TASK else a.task
        delta = None
        if a.mean is not None and b.mean is not None:
            delta = b.mean - a.mean
            by_task[task].append((a.mean, b.mean))
        if (delta is not None and abs(delta) > EPSILON) or (a.mean is None) != (b.mean is None) or not a.ended_like(b):
            changed.append(RowChange(row_id=row_id, task=task, baseline=a, candidate=b, difference=delta))
    changed += [RowChange(row_id=i, task=before[i].task, baseline=before[i], candidate=None) for i in before if i not in after]
    changed += [RowChange(row_id=i, task=after[i].task, baseline=None, candidate=after[i]) for i in after if i not in before]
    changed.sort(key=lambda c: (c.difference if c.difference is not None else math.inf, c.row_id))
    overall = [pair for pairs in by_task.values() for pair in pairs]
    return Comparison(
        baseline=baseline_name, candidate=candidate_name, paired_rows=len(overall),
        only_in_baseline=sum(1 for i in before if i not in after), only_in_candidate=sum(1 for i in after if i not in before),
        difference=_difference(overall), per_task={task: _difference(pairs) for task, pairs in sorted(by_task.items())}, changed=changed,
    )  # fmt: skip


def compare_tables(baseline: pa.Table, candidate: pa.Table, baseline_name: str, candidate_name: str) -> Comparison:
    """:func:`compare` over two results tables."""
    return compare(_records(baseline), _records(candidate), baseline_name, candidate_name)


def _records(table: pa.Table) -> list[dict[str, Any]]:
    return table.select([name for name in COLUMNS if name in table.column_names]).to_pylist()


def _difference(pairs: list[tuple[float, float]]) -> TaskDifference:
    if not pairs:
        return TaskDifference(rows=0)
    return TaskDifference(
        rows=len(pairs), baseline_mean=math.fsum(a for a, _ in pairs) / len(pairs), candidate_mean=math.fsum(b for _, b in pairs) / len(pairs),
        difference=clustered_mean([[b - a] for a, b in pairs]),
    )  # fmt: skip


def _rows(records: Iterable[Mapping[str, Any]]) -> dict[str, RowOutcome]:
    """Each row's outcome in a run, rows in the order they come."""
    rewards: dict[str, list[float]] = defaultdict(list)
    ended: dict[str, Counter[str]] = defaultdict(Counter)
    tasks: dict[str, str] = {}
    for record in records:
        row_id = str(record["row_id"])
        ended[row_id][record["status"]] += 1
        if record.get("task"):
            tasks[row_id] = str(record["task"])
        if record.get("reward") is not None and record["status"] != "cancelled":
            rewards[row_id].append(float(record["reward"]))
    return {
        row_id: RowOutcome(
            task=tasks.get(row_id, NO_TASK), mean=math.fsum(rewards[row_id]) / len(rewards[row_id]) if rewards[row_id] else None,
            ended=", ".join(f"{n} {status}" for status, n in sorted(counts.items())),
            shares={status: n / counts.total() for status, n in counts.items()},
        )  # fmt: skip
        for row_id, counts in ended.items()
    }
