"""The estimators behind a sweep's numbers: a mean with its 95% interval, and pass@k.

**Mean and interval.** The mean of every observation (an attempt's reward). A row's attempts
share its prompt and task, so they are not independent: treating k attempts as k samples would
make any interval too narrow. The standard error is clustered by row (CR1):
``G/(G-1) · Σ_g (Σ_{i∈g} (y_i − ȳ))² / N²`` over ``G`` rows and ``N`` observations (Miller,
"Adding Error Bars to Evals", 2024). The interval must stay inside the rewards' range, which a
normal or Student-t interval on a handful of 0/1 rewards does not, so:

- **0/1 rewards:** the Wilson score interval (always inside [0, 1]) at the *effective* number of
  attempts, ``N / design effect``, the design effect being the clustered variance over the
  variance of ``N`` independent draws (1 with one attempt per row; at most ``N`` attempts count,
  and as few as the ``G`` rows when every row's attempts agree). Its quantile is scipy's, and at
  whole sizes it is scipy's own ``binomtest(...).proportion_ci(method="wilson")`` (tested).
- **Other rewards:** a bootstrap over rows (scipy's BCa: resampled rows keep their attempts
  together), which stays within the smallest and largest reward seen. A bootstrap interval is
  too narrow on few rows, so its level is widened as Hesterberg's *expanded* percentile interval
  widens it ("What Teachers Should Know About the Bootstrap", 2015): the level whose normal
  quantile is ``sqrt(G/(G−1)) · t(0.975, G−1)``. Below :data:`BOOTSTRAP_MIN_ROWS` rows there is
  no interval.

``benchmarks/interval_coverage.py`` measures how often each method covers the true mean.

**pass@k** is the unbiased estimator of Chen et al. (2021), as Harbor computes it
(``harbor/utils/pass_at_k.py``): for a problem attempted ``n`` times with ``c`` passes,
``1 − C(n−c, k) / C(n, k)``, averaged over problems.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from pydantic import BaseModel, Field

#: The interval's confidence level.
CONFIDENCE = 0.95
#: Fewer rows than this get no bootstrap interval: its coverage falls well short of 95%.
BOOTSTRAP_MIN_ROWS = 10
#: Resamples of the bootstrap, seeded so that a run's figures are the same each time they are computed.
BOOTSTRAP_RESAMPLES = 9_999
BOOTSTRAP_SEED = 20241
#: Above this many rows BCa's jackknife (rows² work) gives way to the percentile bootstrap, with fewer
#: resamples: at such sizes the two agree, and the figures stay a second's work.
BCA_MAX_ROWS = 5_000
LARGE_RESAMPLES = 1_999
WILSON = "Wilson score interval"
WILSON_CLUSTERED = "Wilson score interval at the effective attempts (standard error clustered by row, CR1)"
BOOTSTRAP = f"BCa bootstrap over rows ({BOOTSTRAP_RESAMPLES:,} resamples, level expanded for the rows' number)"
LARGE_BOOTSTRAP = f"percentile bootstrap over rows ({LARGE_RESAMPLES:,} resamples, level expanded for the rows' number)"
TOO_FEW = f"too few rows for an interval (a bootstrap over rows needs at least {BOOTSTRAP_MIN_ROWS})"
ALL_EQUAL = "no interval: every value is the same, and there is no spread to resample"


class Estimate(BaseModel):
    """A mean with its 95% confidence interval, and how the interval was found (or why there is none)."""

    mean: float
    n: int = Field(description="Observations (attempts) in the mean.")
    clusters: int = Field(description="Independent units (rows) the standard error is clustered by.")
    se: float | None = Field(default=None, description="Standard error of the mean, clustered by row; none with fewer than two rows.")
    ci95: tuple[float, float] | None = Field(default=None, description="The 95% confidence interval, inside the rewards' range; none when `method` says why.")
    method: str = Field(description="How the interval was computed, or why there is none.")


def clustered_mean(clusters: Sequence[Sequence[float]]) -> Estimate | None:
    """The mean of every value, with a 95% interval that respects ``clusters`` (one per row); None when empty."""
    groups = [[float(value) for value in group] for group in clusters if group]
    values = [value for group in groups for value in group]
    if not values:
        return None
    n, g = len(values), len(groups)
    mean = math.fsum(values) / n
    variance = _cr1_variance(groups, mean) if g >= 2 else None
    se = math.sqrt(variance) if variance is not None else None
    if all(value in (0.0, 1.0) for value in values):
        size = _effective_size(groups, mean, variance)
        return Estimate(mean=mean, n=n, clusters=g, se=se, ci95=wilson_interval(mean, size), method=WILSON if n == g else WILSON_CLUSTERED)
    return _bootstrapped(groups, mean, se)


def mean_difference(differences: Sequence[float]) -> Estimate | None:
    """The mean of paired differences (one per row, e.g. ``candidate − baseline``), with a bootstrap interval
    over rows, which stays between the smallest and the largest difference; None when there is none."""
    values = [float(value) for value in differences]
    if not values:
        return None
    groups = [[value] for value in values]
    mean = math.fsum(values) / len(values)
    return _bootstrapped(groups, mean, math.sqrt(_cr1_variance(groups, mean)) if len(values) >= 2 else None)


def _bootstrapped(groups: list[list[float]], mean: float, se: float | None) -> Estimate:
    """The estimate with a bootstrap interval over ``groups``, or none, saying why."""
    n, g = sum(len(group) for group in groups), len(groups)
    values = [value for group in groups for value in group]
    if g < BOOTSTRAP_MIN_ROWS:
        return Estimate(mean=mean, n=n, clusters=g, se=se, method=TOO_FEW)
    if min(values) == max(values):
        return Estimate(mean=mean, n=n, clusters=g, se=se, method=ALL_EQUAL)
    method = BOOTSTRAP if g <= BCA_MAX_ROWS else LARGE_BOOTSTRAP
    return Estimate(mean=mean, n=n, clusters=g, se=se, ci95=cluster_bootstrap_interval(groups), method=method)


def wilson_interval(proportion: float, size: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of ``proportion`` observed over ``size`` trials (``size`` may be fractional:
    an effective size). At whole sizes it equals ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    shrink = 1 + z * z / size
    centre = (proportion + z * z / (2 * size)) / shrink
    half = z / shrink * math.sqrt(proportion * (1 - proportion) / size + z * z / (4 * size * size))
    return max(0.0, centre - half), min(1.0, centre + half)


def cluster_bootstrap_interval(groups: Sequence[Sequence[float]], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """scipy's bootstrap of the mean of every value, resampling whole rows (``groups``): BCa, or the
    percentile bootstrap above :data:`BCA_MAX_ROWS` rows."""
    from scipy import stats  # imported where used: ~1 s that every CLI and flow start would otherwise pay

    sums = np.array([math.fsum(group) for group in groups])
    sizes = np.array([len(group) for group in groups], dtype=float)

    def pooled_mean(rows: np.ndarray, axis: int = -1) -> np.ndarray:
        return sums[rows].sum(axis=axis) / sizes[rows].sum(axis=axis)

    small = len(groups) <= BCA_MAX_ROWS
    result = stats.bootstrap(
        (np.arange(len(groups)),), pooled_mean, confidence_level=expanded_level(len(groups), confidence), vectorized=True, batch=256,
        n_resamples=BOOTSTRAP_RESAMPLES if small else LARGE_RESAMPLES, method="BCa" if small else "percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )  # fmt: skip
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):  # BCa's correction is undefined on some lopsided samples
        low, high = (float(value) for value in np.percentile(result.bootstrap_distribution, [50 * (1 - confidence), 50 * (1 + confidence)]))
    return low, high


def expanded_level(rows: int, confidence: float = CONFIDENCE) -> float:
    """The level a bootstrap over ``rows`` rows is taken at for ``confidence`` (Hesterberg's expansion): the
    normal quantile grows by ``sqrt(rows/(rows−1))`` and from the normal's to Student's t at ``rows − 1``."""
    from scipy import stats

    quantile = math.sqrt(rows / (rows - 1)) * float(stats.t.ppf(0.5 + confidence / 2, rows - 1))
    return 1 - 2 * float(stats.norm.cdf(-quantile))


def _cr1_variance(groups: Sequence[Sequence[float]], mean: float) -> float:
    """The cluster-robust (CR1) variance of the mean over ``groups`` (at least two)."""
    g, n = len(groups), sum(len(group) for group in groups)
    return g / (g - 1) * math.fsum(math.fsum(value - mean for value in group) ** 2 for group in groups) / n**2


def _effective_size(groups: Sequence[Sequence[float]], mean: float, clustered: float | None) -> float:
    """How many independent attempts ``groups`` are worth: ``N`` over the design effect (``clustered``: their CR1
    variance, None with one row), between 1 and ``N``."""
    n, g = sum(len(group) for group in groups), len(groups)
    if n == g:
        return float(n)
    if clustered is None:
        return 1.0
    independent = _cr1_variance([[value] for group in groups for value in group], mean)
    if independent == 0:  # every attempt agrees: no spread to measure the design effect by, count the rows
        return float(g)
    if clustered == 0:  # every row's mean is the overall mean: worth as much as N draws, no more
        return float(n)
    return min(float(n), max(1.0, n * independent / clustered))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased chance that at least one of ``k`` of the ``n`` attempts passes, ``c`` of them having passed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_at_k_curve(problems: Sequence[tuple[int, int]], max_k: int | None = None) -> dict[int, float]:
    """pass@k for k = 1 … the fewest attempts any problem has (and at most ``max_k``), averaged over
    ``problems``, each ``(attempts, passes)``; empty when there is no problem."""
    problems = [(n, c) for n, c in problems if n > 0]
    if not problems:
        return {}
    top = min(n for n, _ in problems)
    if max_k is not None:
        top = min(top, max_k)
    return {k: math.fsum(pass_at_k(n, c, k) for n, c in problems) / len(problems) for k in range(1, top + 1)}
