"""Two runs of the same rows compared: what changed, overall and per task, and how sure we are.

Rows are paired by id. A row's figure in a run is its mean reward as the run's own mean counts
its attempts (the scoring contract: scored attempts, agent failures as 0); the difference is ``candidate − baseline`` for every row
scored in both, with a bootstrap interval over those rows (each row one observation: its attempts
are already averaged), which stays between the smallest and largest row difference.

How sure: each task's difference and the overall one get a paired test, McNemar's exact test
when every row's figure is 0 or 1 in both runs (scipy's exact binomial test on the rows that
changed), else a paired permutation test (scipy's, swapping each row's two figures); the tasks'
p-values are adjusted for their number by Holm's step-down method. A difference is *worse* or
*better* only when its adjusted p-value is below :data:`ALPHA`. A row *changed outcome* when its figure moved
or its attempts ended differently: another share of successes, failures and cancels (a success
that became a failure has no figure in one run, and is listed all the same; three successes
where there was one are the same outcome, so runs of different attempts compare).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from prefect_harbor.scoring import counted_value
from prefect_harbor.stats.estimators import BOOTSTRAP_SEED, Estimate, mean_difference
from prefect_harbor.stats.summary import COLUMNS, NO_TASK

if TYPE_CHECKING:
    from prefect_harbor.storage.manifest import RunManifest

#: Differences smaller than this are rounding, not change.
EPSILON = 1e-9
#: The significance level of a verdict (after Holm's adjustment across tasks).
ALPHA = 0.05
MCNEMAR = "McNemar's exact test"
PERMUTATION = "paired permutation test"
PERMUTATION_RESAMPLES = 9_999
#: Said wherever a comparison of runs of different datasets is shown.
DIFFERENT_DATASETS = "the runs are of different datasets: only rows with the same id are paired"


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
    test: str | None = Field(default=None, description="The paired test behind `p_value`.")
    p_value: float | None = Field(default=None, description="Two-sided p-value of the paired test (none without rows).")
    p_adjusted: float | None = Field(default=None, description="`p_value` adjusted by Holm's method across the tasks (the overall one: unadjusted).")

    @property
    def verdict(self) -> str:
        """``worse``, ``better``, or ``no clear change`` (adjusted p-value not below :data:`ALPHA`)."""
        if self.difference is None or self.p_adjusted is None or self.p_adjusted >= ALPHA or abs(self.difference.mean) <= EPSILON:
            return "no clear change"
        return "worse" if self.difference.mean < 0 else "better"

    def sureness(self) -> str:
        """``p=0.0078``, or ``p=0.5, could be chance``: the adjusted p-value, in words for a line."""
        p = self.p_adjusted if self.p_adjusted is not None else self.p_value
        if p is None:
            return "not tested"
        return f"p={p:.2g}" + ("" if p < ALPHA else ", could be chance")


class Comparison(BaseModel):
    """``candidate`` against ``baseline``: the paired difference overall and per task, and the rows that changed outcome."""

    baseline: str = Field(description="The baseline run (its folder, or run id).")
    candidate: str
    baseline_started_at: datetime | None = None
    baseline_run_id: str | None = Field(default=None, description="The baseline's run id, when its manifest could be read.")
    baseline_run_name: str | None = Field(default=None, description="The baseline's Prefect flow run name, when its manifest keeps it.")
    different_datasets: bool = Field(default=False, description="The runs' datasets differ (their fingerprints): only rows of the same id are paired.")
    paired_rows: int = Field(description="Rows scored in both runs.")
    only_in_baseline: int = 0
    only_in_candidate: int = 0
    difference: TaskDifference
    per_task: dict[str, TaskDifference] = Field(default_factory=dict)
    changed: list[RowChange] = Field(default_factory=list, description="Rows whose outcome changed, biggest drops first.")

    def of_runs(self, baseline: RunManifest | None, candidate: RunManifest | None) -> Comparison:
        """A copy told what the two runs' manifests say: the baseline's name, id and start, whether the datasets differ."""
        told: dict[str, Any] = {}
        if baseline is not None:
            told.update(baseline_started_at=baseline.started_at, baseline_run_id=baseline.run_id, baseline_run_name=baseline.flow_run_name)
        if baseline is not None and candidate is not None:
            prints = baseline.dataset.get("fingerprint"), candidate.dataset.get("fingerprint")
            told["different_datasets"] = None not in prints and prints[0] != prints[1]
        return self.model_copy(update=told)

    def baseline_label(self) -> str:
        """The baseline as a reader knows it: ``run 'oracle-examples-…' (20261201T…-0f80f944) of 2026-12-01``."""
        if self.baseline_run_id is None:
            return f"the run of {self.baseline_started_at:%Y-%m-%d}" if self.baseline_started_at else f"run {self.baseline}"
        name = f"'{self.baseline_run_name}' ({self.baseline_run_id})" if self.baseline_run_name else self.baseline_run_id
        return f"run {name}" + (f" of {self.baseline_started_at:%Y-%m-%d}" if self.baseline_started_at else "")

    def caveats(self) -> list[str]:
        """What a reader must know before trusting the figures: different datasets, rows in one run only."""
        notes = []
        if self.different_datasets:
            notes.append(DIFFERENT_DATASETS)
        alone: list[str] = []
        for count, run in ((self.only_in_baseline, "baseline"), (self.only_in_candidate, "candidate")):
            if count:
                rows = "" if alone else (" row" if count == 1 else " rows")  # "1 row only in the baseline and 2 only in the candidate"
                alone.append(f"{count}{rows} only in the {run}")
        if alone:
            notes.append(f"{' and '.join(alone)}: left out of every difference")
        return notes

    def worse_tasks(self) -> dict[str, float]:
        """Tasks whose mean dropped, by how much (most first)."""
        drops = {task: d.difference.mean for task, d in self.per_task.items() if d.difference is not None and d.difference.mean < -EPSILON}
        return dict(sorted(drops.items(), key=lambda item: item[1]))

    def regressed(self) -> list[str]:
        """What got worse beyond chance: ``overall`` and the tasks whose verdict is ``worse``."""
        return (["overall"] if self.difference.verdict == "worse" else []) + [task for task, d in self.per_task.items() if d.verdict == "worse"]

    def newly_failing(self) -> list[str]:
        """Rows with a failed attempt in the candidate and none in the baseline."""
        return [c.row_id for c in self.changed if c.baseline and c.candidate and "failure" in c.candidate.ended and "failure" not in c.baseline.ended]

    def phrase(self, listed: int = 3) -> str:
        """In a few words, for a headline: ``2 tasks lower than the run of 2026-12-01: a −0.5 (p=0.5, could be chance),
        b −1 (p=0.0078)``; *worse* when every task named dropped beyond chance."""
        when = self.baseline_label()
        worse = self.worse_tasks()
        if worse:
            named = ", ".join(f"{task} {signed(delta)} ({self.per_task[task].sureness()})" for task, delta in list(worse.items())[:listed])
            more = f" and {len(worse) - listed} more" if len(worse) > listed else ""
            beyond_chance = all(self.per_task[task].verdict == "worse" for task in worse)
            text = f"{len(worse)} task{'s' if len(worse) != 1 else ''} {'worse' if beyond_chance else 'lower'} than {when}: {named}{more}"
        else:
            text = f"no task worse than {when}"
        failing = self.newly_failing()
        if failing:
            text += f"; {len(failing)} row{'s' if len(failing) != 1 else ''} newly failing"
        if self.different_datasets:
            text += " (different datasets)"
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
    per_task = {task: _difference(pairs) for task, pairs in sorted(by_task.items())}
    for task, adjusted in zip(per_task, holm([d.p_value for d in per_task.values()]), strict=True):
        per_task[task].p_adjusted = adjusted
    return Comparison(
        baseline=baseline_name, candidate=candidate_name, paired_rows=len(overall),
        only_in_baseline=sum(1 for i in before if i not in after), only_in_candidate=sum(1 for i in after if i not in before),
        difference=_difference(overall, adjust=False), per_task=per_task, changed=changed,
    )  # fmt: skip


def compare_tables(baseline: pa.Table, candidate: pa.Table, baseline_name: str, candidate_name: str) -> Comparison:
    """:func:`compare` over two results tables."""
    return compare(_records(baseline), _records(candidate), baseline_name, candidate_name)


def _records(table: pa.Table) -> list[dict[str, Any]]:
    return table.select([name for name in COLUMNS if name in table.column_names]).to_pylist()


def _difference(pairs: list[tuple[float, float]], adjust: bool = True) -> TaskDifference:
    """The paired difference of ``pairs`` (baseline, candidate), its interval and its test; ``p_adjusted`` is
    left for the caller to set across tasks unless ``adjust`` is false (then it is the p-value itself)."""
    if not pairs:
        return TaskDifference(rows=0)
    test, p_value = paired_test(pairs)
    return TaskDifference(
        rows=len(pairs), baseline_mean=math.fsum(a for a, _ in pairs) / len(pairs), candidate_mean=math.fsum(b for _, b in pairs) / len(pairs),
        difference=mean_difference([b - a for a, b in pairs]), test=test, p_value=p_value, p_adjusted=None if adjust else p_value,
    )  # fmt: skip


def paired_test(pairs: list[tuple[float, float]]) -> tuple[str, float]:
    """The two-sided paired test of ``pairs`` (baseline, candidate): McNemar's exact test when every figure is
    0 or 1, else a paired permutation test of the mean difference."""
    from scipy import stats  # imported where used: ~1 s that every CLI start would otherwise pay

    if all(a in (0.0, 1.0) and b in (0.0, 1.0) for a, b in pairs):
        lost = sum(1 for a, b in pairs if a > b)
        gained = sum(1 for a, b in pairs if b > a)
        return MCNEMAR, 1.0 if lost + gained == 0 else float(stats.binomtest(gained, lost + gained, 0.5).pvalue)
    if all(abs(b - a) <= EPSILON for a, b in pairs):
        return PERMUTATION, 1.0
    before, after = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    result = stats.permutation_test(
        (before, after), lambda x, y, axis=-1: np.mean(y - x, axis=axis), permutation_type="samples",
        n_resamples=PERMUTATION_RESAMPLES, vectorized=True, rng=np.random.default_rng(BOOTSTRAP_SEED),
    )  # fmt: skip
    return PERMUTATION, float(result.pvalue)


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (Holm, 1979) of the p-values that are given (None stays None): the i-th
    smallest of m is multiplied by m − i + 1, then made non-decreasing and capped at 1."""
    given = sorted((p, index) for index, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(given):
        running = max(running, min(1.0, (len(given) - rank) * p))
        adjusted[index] = running
    return adjusted


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
        value = counted_value(record)
        if value is not None:
            rewards[row_id].append(value)
    return {
        row_id: RowOutcome(
            task=tasks.get(row_id, NO_TASK), mean=math.fsum(rewards[row_id]) / len(rewards[row_id]) if rewards[row_id] else None,
            ended=", ".join(f"{n} {status}" for status, n in sorted(counts.items())),
            shares={status: n / counts.total() for status, n in counts.items()},
        )  # fmt: skip
        for row_id, counts in ended.items()
    }
