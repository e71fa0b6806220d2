"""How big the next sweep must be: rows × attempts to see a given difference, from a run's own spread.

A comparison of two sweeps pairs rows by id (``stats/compare.py``), so what limits it is how much
a row's figure moves between runs by chance: the spread of a row's attempts (the *within-row*
variance, σ²_w), averaged over ``k`` attempts in each run. The difference of a row's figures
then has variance ``2·σ²_w/k``, and the paired t-test over ``n`` rows has the power that
scipy's noncentral t distribution gives. Two assumptions, said wherever a plan is shown: the
change moves every row alike (rows that change unevenly need more), and the next runs spread
like this one.

σ²_w is the pooled variance of the attempts within each row (the one-way analysis of variance's
within-group mean square) when the run has rows with two attempts or more. A run of one attempt
per row cannot tell a row's chance from the rows' differences: its whole variance is used, an
upper bound, so the plan errs on the side of more rows (and says so).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from prefect_harbor.scoring import counted_value

#: Defaults: the power and significance level a plan is made for.
POWER = 0.8
ALPHA = 0.05
#: Attempts per row a plan is shown for.
ATTEMPTS = (1, 2, 4, 8)
#: No plan asks for more rows than this; beyond it, the difference is too small to see.
MAX_ROWS = 1_000_000


class Spread(BaseModel):
    """A run's attempts as a plan reads them (the scoring contract: scored attempts, agent failures as 0)."""

    rows: int = Field(description="Rows with at least one counted attempt.")
    attempts: int = Field(description="Counted attempts.")
    mean: float | None = None
    within: float = Field(description="σ²_w: the variance of a row's attempts about the row's mean (pooled), or its upper bound.")
    within_is_bound: bool = Field(description="No row has two counted attempts: σ²_w is the run's whole variance, an upper bound.")


class PlanRow(BaseModel):
    attempts: int = Field(description="Attempts per row in each of the two runs.")
    rows: int | None = Field(description="Rows needed (None: more than MAX_ROWS).")
    trials: int | None = Field(description="Trials per run: rows × attempts.")
    detectable_now: float | None = Field(description="The difference this run's own number of rows would detect at these attempts.")


class Plan(BaseModel):
    """Rows × attempts for each of two runs to detect ``difference`` with ``power`` (two-sided paired t-test at ``alpha``)."""

    difference: float
    power: float
    alpha: float
    spread: Spread
    options: list[PlanRow]
    assumptions: str = (
        "the change moves every row alike (rows that change unevenly need more), and the next runs spread like this one"
    )


def counted_by_row(records: Iterable[Mapping[str, Any]]) -> list[list[float]]:
    """Each row's counted attempts (``scoring.counted_value``), rows in first-seen order; rows with none left out."""
    rows: dict[str, list[float]] = defaultdict(list)
    for record in records:
        value = counted_value(record)
        if value is not None:
            rows[str(record["row_id"])].append(value)
    return [values for values in rows.values() if values]


def spread_of(groups: list[list[float]]) -> Spread:
    """The within-row variance of ``groups`` (each a row's counted attempts), pooled, or its upper bound."""
    values = [v for group in groups for v in group]
    if len(values) < 2:
        raise ValueError("a plan needs a run with at least two counted attempts")
    mean = math.fsum(values) / len(values)
    degrees = sum(len(group) - 1 for group in groups)
    if degrees > 0:
        squares = math.fsum((v - math.fsum(group) / len(group)) ** 2 for group in groups for v in group)
        return Spread(rows=len(groups), attempts=len(values), mean=mean, within=squares / degrees, within_is_bound=False)
    total = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return Spread(rows=len(groups), attempts=len(values), mean=mean, within=total, within_is_bound=True)


def paired_power(rows: int, difference: float, sd: float, alpha: float = ALPHA) -> float:
    """The power of the two-sided paired t-test over ``rows`` rows whose differences have standard deviation ``sd``."""
    from scipy import stats  # imported where used: ~1 s that every CLI start would otherwise pay

    if rows < 2:
        return 0.0
    if sd == 0:
        return 1.0
    df, shift = rows - 1, abs(difference) / sd * math.sqrt(rows)
    critical = float(stats.t.ppf(1 - alpha / 2, df))
    upper, lower = float(stats.nct.sf(critical, df, shift)), float(stats.nct.cdf(-critical, df, shift))
    # Far in a tail scipy's noncentral t can return NaN for what is 0 (or 1) to double precision.
    upper = (1.0 if shift > critical else 0.0) if math.isnan(upper) else upper
    return min(1.0, upper + (0.0 if math.isnan(lower) else lower))


def rows_needed(difference: float, sd: float, power: float = POWER, alpha: float = ALPHA) -> int | None:
    """The fewest rows whose paired t-test reaches ``power`` (None: more than :data:`MAX_ROWS`)."""
    if paired_power(MAX_ROWS, difference, sd, alpha) < power:
        return None
    low, high = 2, MAX_ROWS  # power grows with rows: bisect for the first that reaches it
    while low < high:
        middle = (low + high) // 2
        if paired_power(middle, difference, sd, alpha) >= power:
            high = middle
        else:
            low = middle + 1
    return low


def detectable(rows: int, sd: float, power: float = POWER, alpha: float = ALPHA) -> float | None:
    """The smallest difference ``rows`` rows detect with ``power`` (None: too few rows for a test)."""
    from scipy import optimize

    if rows < 2:
        return None
    if sd == 0:
        return 0.0
    return float(optimize.brentq(lambda d: paired_power(rows, d, sd, alpha) - power, 1e-12, 100 * sd))


def plan(records: Iterable[Mapping[str, Any]], difference: float, power: float = POWER, alpha: float = ALPHA,
         attempts: Iterable[int] = ATTEMPTS) -> Plan:  # fmt: skip
    """The plan for detecting ``difference`` from the run whose results are ``records``."""
    spread = spread_of(counted_by_row(records))
    options = []
    for k in attempts:
        sd = math.sqrt(2 * spread.within / k)
        needed = rows_needed(difference, sd, power, alpha)
        options.append(PlanRow(attempts=k, rows=needed, trials=None if needed is None else needed * k, detectable_now=detectable(spread.rows, sd, power, alpha)))
    return Plan(difference=difference, power=power, alpha=alpha, spread=spread, options=options)
