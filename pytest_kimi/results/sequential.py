"""Looking at an SLO again as more requests come in, without giving up the stated error rate
(``--kimi-until-decided``): pure functions of the plan and the requests so far.

Recomputing a fixed-size interval after each batch is wrong: every look is another chance of
a wrong verdict, and a run that stops at the first decisive look makes one far more often than
``1 - C``. So the looks are planned (the planned requests, then a batch at a time up to a
most), and the error rate ``alpha = 1 - C`` is spent over them in advance: look ``j`` judges
at its own level ``alpha_j``, with ``sum(alpha_j) <= alpha``. A wrong verdict at any look needs
the truth outside that look's bound, so by the union bound (Bonferroni) the chance of one over
the whole run is at most ``alpha``, however the looks depend on each other and whichever look
the run stops at.

Each side is spent on its own. A wrong pass needs a truly slow layout and a wrong fail a truly
fast one, never both, so the upper bounds (which pass) and the lower bounds (which fail) may
each spend all of ``alpha``. And a look where a side can have no bound at all (the upper bound
of a p95 before 59 requests at 95%) passes what it would have spent on to the next look: the
schedule depends on the request counts alone, never on the data, so the guarantee stands.

How ``alpha`` is spread: the power family of error-spending functions (Kim and DeMets,
"Design and analysis of group sequential tests based on the type I error spending rate
function", Biometrika 74, 1987), ``alpha(t) = alpha t^rho`` at information fraction
``t = n / most``; a look spends ``alpha(t_j) - alpha(t_{j-1})``. ``rho = 1`` spends evenly;
the default ``rho = 0.2`` spends three quarters of ``alpha`` by a quarter of the most, so a
limit far from the truth is decided early (a pass of a p95 at 100 requests with one request
over the limit needs 3.7% of the 5%), and a limit near it, which no number of requests
decides quickly, gives up little.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

SPENDING_POWER = 0.2  # rho of alpha t^rho (see the module docstring)


def batch_size(planned: int) -> int:
    """The requests of each batch after ``planned``: half as many again, so the first look
    after the planned one comes at 2.5 x (100 for the seed's 40), where a p95 can pass at 95%
    with one request over its limit (at 80 it needs none over; 2 x would look there)."""
    return -(-3 * planned // 2)


def batches_for(planned: int, most: int) -> int:
    """How many batches of :func:`batch_size` bring ``planned`` to at least ``most``."""
    return max(0, -(-(most - planned) // batch_size(planned)))


@dataclass(frozen=True)
class LookPlan:
    """Looks at ``first`` requests, then every ``batch`` more, up to ``most``, spending
    ``alpha`` per side over them as ``alpha (n / most)^power``."""

    first: int
    batch: int
    most: int
    alpha: float
    power: float = SPENDING_POWER

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.most and self.batch > 0 and 0 < self.alpha < 0.5
                and self.power > 0):  # fmt: skip
            raise ValueError(f"a look plan needs 0 < first <= most, batch > 0, 0 < alpha < 0.5 "
                             f"and power > 0, got {self}")  # fmt: skip

    def sizes(self) -> list[int]:
        """The requests judged at each look: ``first``, ``first + batch``, ..., ``most``."""
        sizes = list(range(self.first, self.most, self.batch))
        return [*sizes, self.most] if not sizes or sizes[-1] != self.most else sizes

    def spent(self, n: int) -> float:
        """The error one side has spent by the time ``n`` requests were judged."""
        return self.alpha * min(n / self.most, 1.0) ** self.power

    def levels(self, bounded: Callable[[int, float], bool] = lambda n, a: True) -> list[float]:
        """Each look's error level for one side. ``bounded(n, a)``: whether that side can
        have a bound at all of ``n`` requests at error ``a``; where it cannot, the look spends
        nothing and its share goes on to the next look."""
        out, before = [], 0.0
        for n in self.sizes():
            level = self.spent(n) - before
            if bounded(n, level):
                out.append(level)
                before = self.spent(n)
            else:
                out.append(0.0)
        return out


@dataclass(frozen=True)
class Look:
    """Look ``index`` (0-based) of ``of`` at ``n`` requests, judging the upper bounds at
    error ``upper`` and the lower at ``lower`` (0: that side not judged at this look)."""

    index: int
    of: int
    n: int
    upper: float
    lower: float


@functools.cache
def looks_for(plan: LookPlan, percentile: float | None) -> tuple[Look, ...]:
    """Every look of ``plan`` for an SLO on the ``percentile``-th percentile (None: a mean or
    a rate, bounded at any count), each side's levels spent as the module docstring says."""
    from pytest_kimi.results.intervals import quantile_ranks

    def side(which: int) -> Callable[[int, float], bool]:
        if percentile is None:
            return lambda n, a: a > 0
        return lambda n, a: a > 0 and quantile_ranks(n, percentile / 100, 1 - a)[which] is not None

    sizes = plan.sizes()
    upper, lower = plan.levels(side(1)), plan.levels(side(0))
    sides = zip(sizes, upper, lower, strict=True)
    return tuple(Look(i, len(sizes), n, up, down) for i, (n, up, down) in enumerate(sides))
