"""Stopping a sweep once its mean is known well enough: attempts in rounds, until the interval is narrow.

With ``stop_at_ci_width`` a sweep runs every row's attempt 1, then every row's attempt 2, and
so on up to ``attempts``; after each round it computes the mean's 95% interval over every
attempt so far (``summary.summarize``: the same figures ``summary.json`` gives) and stops once
that interval is no wider than the target. ``attempts`` is the budget: the most a row may get.

The rule reads the interval's width, not the mean, so stopping on it keeps the reported interval
honest (stopping on the mean's value would not); a Wilson interval's width still depends a little
on the mean, and ``benchmarks/interval_coverage.py`` measures the reported interval's coverage
under the rule (93.8 to 95.7% over 10 to 100 rows, 2,000 simulated sweeps each).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from prefect_harbor.config import ConfigurationError
from prefect_harbor.outcome import figure
from prefect_harbor.spec import BackendSpec
from prefect_harbor.stats.estimators import Estimate
from prefect_harbor.stats.summary import summarize_table


def check_stopping(width: float | None, attempts: int, *, sharded: bool = False, rerun: bool = False) -> None:
    """Refuse a stopping rule the sweep cannot honour, naming the field and the fix."""
    if width is None:
        return
    if not width > 0:
        raise ConfigurationError(f"stop_at_ci_width: {width!r} is not a width; give a positive number (e.g. 0.1), or leave it empty to run every attempt.")
    if attempts < 2:
        raise ConfigurationError(
            f"stop_at_ci_width: it adds attempts until the interval is {figure(width)} wide, and attempts is {attempts}; "
            "give attempts 2 or more (the most each row may get), or leave stop_at_ci_width empty."
        )
    if sharded:
        raise ConfigurationError("stop_at_ci_width: the stopping rule decides over every row after each round, on one host; drop shards or stop_at_ci_width.")
    if rerun:
        raise ConfigurationError("stop_at_ci_width: a re-run of failed attempts runs exactly those attempts; drop rerun_failed or stop_at_ci_width.")


def narrow_enough(estimate: Estimate | None, width: float) -> bool:
    """The rule itself: the mean has an interval, and it is no wider than ``width``."""
    return estimate is not None and estimate.ci95 is not None and estimate.ci95[1] - estimate.ci95[0] <= width


@dataclass(frozen=True)
class Verdict:
    """Whether to stop after a round, and why: ``after attempt 2 of at most 4 per row`` (``when``), then what was found and done."""

    stop: bool
    when: str
    finding: str

    @property
    def reason(self) -> str:
        return f"{self.when}, {self.finding}"


@dataclass(frozen=True)
class StoppedEarly:
    """A sweep the stopping rule ended before its last round: each row got ``attempts`` of at most ``budget``."""

    attempts: int
    budget: int
    #: What the rule found after the last round it ran (``Verdict.finding``).
    finding: str

    def spec_of(self, config: BackendSpec) -> BackendSpec:
        """The configuration as run: ``attempts`` per row (what the statistics, pass@k and Harbor's job count)."""
        return config.model_copy(update={"limits": config.limits.model_copy(update={"attempts": self.attempts})})

    def phrase(self) -> str:
        """What the headline says: ``stopped after 2 of at most 4 attempts per row (…)``."""
        return f"stopped after {self.attempts} of at most {self.budget} attempts per row: {self.finding}"


@dataclass(frozen=True)
class StopRule:
    """Stop once the mean's 95% interval is no wider than ``width``, or after ``attempts`` rounds."""

    width: float
    attempts: int

    def after_round(self, round_number: int, recorded: pa.Table) -> Verdict:
        """The verdict after attempt ``round_number`` of every row, from every result row recorded so far."""
        estimate = summarize_table(recorded, self.attempts).reward
        when = f"after attempt {round_number} of at most {self.attempts} per row"
        last = round_number >= self.attempts
        then = "the attempts are spent" if last else f"running attempt {round_number + 1}"
        if estimate is None or estimate.ci95 is None:
            why = "no attempt was counted" if estimate is None else estimate.method
            return Verdict(last, when, f"no interval yet ({why}): {then}")
        low, high = estimate.ci95
        said = f"the mean's 95% interval is {figure(high - low)} wide ({figure(low)} to {figure(high)})"
        if narrow_enough(estimate, self.width):
            return Verdict(True, when, f"{said}, within stop_at_ci_width {figure(self.width)}: stopping")
        return Verdict(last, when, f"{said}, wider than {figure(self.width)}: {then}")
