"""The estimators behind a sweep's numbers: a mean with its 95% interval, and pass@k.

**Mean and interval.** The mean of every observation (an attempt's reward), with a standard
error clustered by row: a row's attempts share its prompt and task, so they are not
independent, and treating k attempts as k independent samples would make the interval too
narrow. The cluster-robust (CR1) variance is ``G/(G-1) · Σ_g (Σ_{i∈g} (y_i − ȳ))² / N²`` over
``G`` rows and ``N`` observations; with one observation per row it is exactly ``s²/N``, the
ordinary standard error of the mean. The interval is ``ȳ ± t(0.975, G−1) · SE`` (Student's t,
which matters for the few rows small sweeps have: 2.45 rather than 1.96 at 7 rows). See
Miller, "Adding Error Bars to Evals" (2024), for why evaluations should cluster this way.

**pass@k** is the unbiased estimator of Chen et al. (2021), as Harbor computes it
(``harbor/utils/pass_at_k.py``): for a problem attempted ``n`` times with ``c`` passes,
``1 − C(n−c, k) / C(n, k)``, averaged over problems.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, Field

#: The interval's confidence level.
CONFIDENCE = 0.95
CLUSTERED = "t interval, standard error clustered by row (CR1)"
SIMPLE = "t interval, standard error of the mean"


class Estimate(BaseModel):
    """A mean with its 95% confidence interval (none with fewer than two rows)."""

    mean: float
    n: int = Field(description="Observations (attempts) in the mean.")
    clusters: int = Field(description="Independent units (rows) the standard error is clustered by.")
    se: float | None = Field(default=None, description="Standard error of the mean; none with fewer than two rows.")
    ci95: tuple[float, float] | None = Field(default=None, description="The 95% confidence interval; none with fewer than two rows.")
    method: str = Field(description="How the interval was computed.")


def clustered_mean(clusters: Sequence[Sequence[float]]) -> Estimate | None:
    """The mean of every value, with a standard error clustered by ``clusters`` (one per row); None when empty."""
    groups = [list(group) for group in clusters if group]
    values = [value for group in groups for value in group]
    if not values:
        return None
    n, g = len(values), len(groups)
    mean = math.fsum(values) / n
    method = CLUSTERED if n > g else SIMPLE
    if g < 2:
        return Estimate(mean=mean, n=n, clusters=g, method=method)
    variance = g / (g - 1) * math.fsum(math.fsum(value - mean for value in group) ** 2 for group in groups) / n**2
    se = math.sqrt(variance)
    half = t_quantile(0.5 + CONFIDENCE / 2, g - 1) * se
    return Estimate(mean=mean, n=n, clusters=g, se=se, ci95=(mean - half, mean + half), method=method)


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


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: the ``t`` with ``P(T <= t) = p`` at ``df`` degrees of freedom (0.5 < p < 1)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (p={p}, df={df})")
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):  # bisection: the CDF is monotone, and 200 halvings reach float precision
        middle = (low + high) / 2
        if _t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: ``1 − I_x(df/2, 1/2) / 2`` with ``x = df / (df + t²)``."""
    return 1.0 - 0.5 * _regularized_beta(df / (df + t * t), df / 2, 0.5)


def _regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point: use the symmetry
        return 1.0 - _regularized_beta(1 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result / a
