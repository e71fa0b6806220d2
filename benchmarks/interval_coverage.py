"""How often a sweep's 95% interval holds the true mean: the coverage of each method, simulated.

    .venv/bin/python benchmarks/interval_coverage.py [--reps 1000] [--seed 1]

For each reward kind and number of rows (5, 10, 30, 100), draws ``--reps`` sweeps from a known
distribution, computes the interval exactly as a sweep does (``clustered_mean``) and counts how
often it holds the true mean (target: 95% ± 2), how often there was no interval, and how often
it left the rewards' range. Beside it, as the baseline, the Student-t interval the sweeps used
before (``mean ± t(0.975, rows − 1) · clustered SE``), with how often it left the range.

Kinds: 0/1 rewards with one attempt per row at success rates 0.5 and 0.9; 0/1 rewards with
3 attempts per row whose rows differ in difficulty (a row's rate drawn from Beta(2, 1), true
mean 2/3), the case the clustered effective size is for; continuous rewards in [0, 1], 2 attempts
per row around the row's own mean, itself from Beta(2, 5) (true mean 2/7).

Then the stopping rule (``stop_at_ci_width``, ``prefect_harbor/stats/stopping.py``): the rows of
different difficulty get attempts round by round, up to 8, until the interval is no wider than
the target; the coverage of the interval the sweep then reports, and the attempts per row it used.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable

from scipy import stats

from prefect_harbor.stats.estimators import clustered_mean
from prefect_harbor.stats.stopping import narrow_enough

ROWS = (5, 10, 30, 100)
Sweep = list[list[float]]


def binary(rate: float) -> tuple[float, Callable[[random.Random, int], Sweep]]:
    return rate, lambda rng, rows: [[float(rng.random() < rate)] for _ in range(rows)]


def clustered_binary() -> tuple[float, Callable[[random.Random, int], Sweep]]:
    def draw(rng: random.Random, rows: int) -> Sweep:
        return [[float(rng.random() < rate) for _ in range(3)] for rate in (rng.betavariate(2, 1) for _ in range(rows))]

    return 2 / 3, draw


def continuous() -> tuple[float, Callable[[random.Random, int], Sweep]]:
    def draw(rng: random.Random, rows: int) -> Sweep:
        # A row's own mean m ~ Beta(2, 5); its two attempts ~ Beta(10m, 10(1 − m)), around it: the mean stays 2/7.
        means = [rng.betavariate(2, 5) for _ in range(rows)]
        return [[rng.betavariate(10 * m, 10 * (1 - m)) for _ in range(2)] for m in means]

    return 2 / 7, draw


def t_interval(sweep: Sweep) -> tuple[float, float] | None:
    estimate = clustered_mean(sweep)
    if estimate is None or estimate.se is None:
        return None
    half = float(stats.t.ppf(0.975, estimate.clusters - 1)) * estimate.se
    return estimate.mean - half, estimate.mean + half


def measure(truth: float, draw: Callable[[random.Random, int], Sweep], rows: int, reps: int, seed: int) -> dict[str, float | str]:
    rng = random.Random(seed)
    covered = none = outside = t_covered = t_outside = t_count = 0
    method = ""
    for _ in range(reps):
        sweep = draw(rng, rows)
        estimate = clustered_mean(sweep)
        assert estimate is not None
        method = estimate.method
        if estimate.ci95 is None:
            none += 1
        else:
            low, high = estimate.ci95
            covered += low <= truth <= high
            outside += low < 0 or high > 1
        baseline = t_interval(sweep)
        if baseline is not None and not math.isnan(baseline[0]):
            t_count += 1
            t_covered += baseline[0] <= truth <= baseline[1]
            t_outside += baseline[0] < 0 or baseline[1] > 1
    given = reps - none
    return {
        "coverage": covered / given if given else math.nan, "no interval": none / reps, "outside [0,1]": outside / reps,
        "t coverage": t_covered / t_count if t_count else math.nan, "t outside [0,1]": t_outside / reps, "method": method,
    }  # fmt: skip


def measure_stopping(rows: int, width: float, budget: int, reps: int, seed: int) -> dict[str, float]:
    """Coverage of the reported interval when attempts are added until it is ``width`` wide (rows of different difficulty, true mean 2/3)."""
    rng = random.Random(seed)
    covered = given = rounds_used = 0
    for _ in range(reps):
        rates = [rng.betavariate(2, 1) for _ in range(rows)]
        attempts = [[float(rng.random() < rate) for _ in range(budget)] for rate in rates]
        for rounds in range(1, budget + 1):
            estimate = clustered_mean([row[:rounds] for row in attempts])
            if narrow_enough(estimate, width):
                break
        rounds_used += rounds
        if estimate is not None and estimate.ci95 is not None:
            given += 1
            covered += estimate.ci95[0] <= 2 / 3 <= estimate.ci95[1]
    return {"coverage": covered / given if given else math.nan, "attempts": rounds_used / reps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1000, help="simulated sweeps per kind and size (Monte Carlo error ~0.7 points at 1000)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    kinds = {
        "0/1, rate 0.5, 1 attempt": binary(0.5),
        "0/1, rate 0.9, 1 attempt": binary(0.9),
        "0/1, rows differ, 3 attempts": clustered_binary(),
        "continuous, rows differ, 2 attempts": continuous(),
    }
    print(f"{'rewards':<34} {'rows':>4} {'coverage':>9} {'none':>6} {'outside':>8} {'t coverage':>11} {'t outside':>10}  method")
    for name, (truth, draw) in kinds.items():
        for rows in ROWS:
            r = measure(truth, draw, rows, args.reps, args.seed)
            print(
                f"{name:<34} {rows:>4} {r['coverage']:>9.1%} {r['no interval']:>6.0%} {r['outside [0,1]']:>8.0%} "
                f"{r['t coverage']:>11.1%} {r['t outside [0,1]']:>10.0%}  {r['method']}"
            )
    print(f"\n{'stopping rule (0/1, rows differ)':<34} {'rows':>4} {'width':>6} {'coverage':>9} {'attempts per row':>17}")
    for rows, width in ((10, 0.4), (30, 0.25), (30, 0.3), (100, 0.15)):
        r = measure_stopping(rows, width, 8, args.reps, args.seed)
        print(f"{'':<34} {rows:>4} {width:>6} {r['coverage']:>9.1%} {r['attempts']:>17.2f}")


if __name__ == "__main__":
    main()
