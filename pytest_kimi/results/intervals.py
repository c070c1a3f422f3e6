"""Confidence bounds for SLO verdicts (``--kimi-confidence``): pure functions of a run's
per-request values, no resampling.

An SLO verdict at confidence ``C`` compares two one-sided bounds with its limit: the upper
bound, under which the true figure lies with probability at least ``C``, and the lower bound,
over which it lies with probability at least ``C``. All of the interval under a ceiling:
passed; all of it over: failed; straddling it: undecided. Whatever the truth, only one kind of
wrong verdict is possible (a truly fast layout can only be failed wrongly, a truly slow one
only passed wrongly), and each needs the truth outside one of the bounds: a wrong verdict has
probability at most ``1 - C`` (docs/metrics.md, "SLO verdicts at a confidence").

* A percentile (``ttft_p95``): the order-statistic bounds, distribution-free and exact. Of
  ``n`` independent requests, the number below the true ``p``-th quantile is Binomial(n, p),
  so the ``k``-th smallest value lies at or over the quantile with probability
  ``P(B <= k - 1)``: the upper bound is the smallest such ``k`` reaching ``C``, the lower
  bound the largest ``k`` with ``P(B >= k) >= C``. Where no rank reaches ``C`` there is no
  bound: a 95% upper bound on a p95 needs ``0.95^n <= 0.05``, 59 requests.
* A mean (``tpot_mean``): Student's t bounds, ``mean +- t(C, n-1) s / sqrt(n)``. The t bound
  is deterministic, so the same records always give the same verdict, and at the 40 or more
  requests of a run the mean of per-request latencies is near normal; a bootstrap would add
  resampling noise to a pass/fail decision for little gain at these sizes.
* A success rate: the Clopper-Pearson bounds of a binomial proportion (exact).

``scipy.stats`` (the binomial, t and beta distributions) is imported by the functions that use
it: importing it takes 0.7 s of CPU, and every pytest process imports this module, most of
them never asking for a bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

NEVER = 100_000  # "more requests than any run sends": a limit at the true value never decides


@dataclass(frozen=True)
class Bounds:
    """One-sided bounds at ``confidence`` (``-inf`` / ``inf`` where the data allow none),
    how they were found, and how many requests they rest on."""

    lower: float
    upper: float
    confidence: float
    method: str  # "order statistics", "t", "Clopper-Pearson"
    n: int
    # a sequential look (--kimi-until-decided): each side at its own spent level
    lower_confidence: float | None = None
    upper_confidence: float | None = None


def quantile_ranks(n: int, p: float, confidence: float) -> tuple[int | None, int | None]:
    """The 1-based ranks of the order statistics bounding the ``p``-quantile (``0 < p < 1``)
    of ``n`` values from below and from above at ``confidence``; None where none does."""
    from scipy import stats

    ks = np.arange(1, n + 1)
    at_or_over = stats.binom.cdf(ks - 1, n, p)  # P(x_(k) >= q) = P(B <= k - 1)
    at_or_under = stats.binom.sf(ks - 1, n, p)  # P(x_(k) <= q) = P(B >= k)
    upper = ks[at_or_over >= confidence]
    lower = ks[at_or_under >= confidence]
    return (int(lower[-1]) if lower.size else None), (int(upper[0]) if upper.size else None)


def quantile_bounds(
    values: Sequence[float], percentile: float, confidence: float,
    sides: tuple[float, float] | None = None,
) -> Bounds:  # fmt: skip
    """Order-statistic bounds on the ``percentile``-th percentile (0-100) of the distribution
    ``values`` were drawn from; ``sides``: (lower, upper) confidences of a sequential look
    (1: that side unbounded), over ``confidence``."""
    ordered = np.sort(np.asarray(values, dtype=float))
    if sides is not None:
        return _sided(quantile_bounds(values, percentile, sides[0]),
                      quantile_bounds(values, percentile, sides[1]), confidence, sides)  # fmt: skip
    lo, hi = quantile_ranks(len(ordered), percentile / 100, confidence)
    return Bounds(
        lower=float(ordered[lo - 1]) if lo else -math.inf,
        upper=float(ordered[hi - 1]) if hi else math.inf,
        confidence=confidence,
        method="order statistics",
        n=len(ordered),
    )


def _sided(
    low: Bounds, high: Bounds, confidence: float, sides: tuple[float, float]
) -> Bounds:
    """The lower bound of ``low`` and the upper of ``high`` (a side at confidence 1: none)."""
    return Bounds(
        lower=-math.inf if sides[0] >= 1 else low.lower,
        upper=math.inf if sides[1] >= 1 else high.upper,
        confidence=confidence, method=low.method, n=low.n,
        lower_confidence=sides[0], upper_confidence=sides[1],
    )  # fmt: skip


def fewest_for_upper_bound(percentile: float, confidence: float) -> int:
    """The fewest requests with any upper bound on the ``percentile``-th percentile: the
    largest value bounds it with probability ``1 - p^n`` (59 for a p95 at 0.95)."""
    p = percentile / 100
    return math.ceil(math.log(1 - confidence) / math.log(p))


def mean_bounds(
    values: Sequence[float], confidence: float, sides: tuple[float, float] | None = None
) -> Bounds:
    """Student's t bounds on the mean of the distribution ``values`` were drawn from;
    ``sides`` as for :func:`quantile_bounds`."""
    if sides is not None:
        return _sided(mean_bounds(values, sides[0]), mean_bounds(values, sides[1]),
                      confidence, sides)  # fmt: skip
    from scipy import stats

    data = np.asarray(values, dtype=float)
    n = len(data)
    if n < 2:
        return Bounds(-math.inf, math.inf, confidence, "t", n)
    half = stats.t.ppf(confidence, n - 1) * data.std(ddof=1) / math.sqrt(n)
    mean = float(data.mean())
    return Bounds(float(mean - half), float(mean + half), confidence, "t", n)


def proportion_bounds(
    successes: int, n: int, confidence: float, sides: tuple[float, float] | None = None
) -> Bounds:
    """Clopper-Pearson bounds on a success probability from ``successes`` of ``n``;
    ``sides`` as for :func:`quantile_bounds`."""
    if sides is not None:
        return _sided(proportion_bounds(successes, n, sides[0]),
                      proportion_bounds(successes, n, sides[1]), confidence, sides)  # fmt: skip
    from scipy import stats

    alpha = 1 - confidence
    lower = stats.beta.ppf(alpha, successes, n - successes + 1) if successes else 0.0
    upper = stats.beta.ppf(confidence, successes + 1, n - successes) if successes < n else 1.0
    return Bounds(float(lower), float(upper), confidence, "Clopper-Pearson", n)


def quantile_requests_needed(
    values: Sequence[float], percentile: float, limit: float, confidence: float
) -> int:
    """How many requests would likely decide a ``percentile`` SLO at ``limit``, if the
    requests to come are like ``values``: the fewest ``n`` at which the bounding rank falls
    on the limit's side of the share of values under it. ``NEVER`` where the share is the
    percentile itself (a limit at the true value)."""
    share = float(np.mean(np.asarray(values, dtype=float) <= limit)) if len(values) else 0.0
    p = percentile / 100
    if not len(values) or math.isclose(share, p):
        return NEVER

    def decides(n: int) -> bool:
        lo, hi = quantile_ranks(n, p, confidence)
        under = math.floor(n * share)  # values expected at or under the limit
        if share > p:
            return hi is not None and hi <= under
        return lo is not None and lo > under

    return _fewest(decides, len(values))


def mean_requests_needed(values: Sequence[float], limit: float, confidence: float) -> int:
    """How many requests would likely put the t bound of the mean on one side of ``limit``,
    if the requests to come are like ``values``."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2 or float(data.mean()) == limit:
        return NEVER
    from scipy import stats

    gap, spread = abs(float(data.mean()) - limit), float(data.std(ddof=1))
    return _fewest(lambda n: stats.t.ppf(confidence, n - 1) * spread / math.sqrt(n) < gap,
                   len(data))  # fmt: skip


def _fewest(decides: Callable[[int], bool], start: int) -> int:
    """The fewest ``n >= 2`` (from about ``start``) with ``decides(n)``: doubling to one that
    does, then halving the gap; ``NEVER`` past it."""
    low, high = 1, max(start, 2)
    while not decides(high):
        low, high = high, high * 2
        if high >= NEVER:
            return NEVER
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if decides(mid) else (mid, high)
    return high
