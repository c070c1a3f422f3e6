"""Change points in one metric's series of runs: where its level moved, and by how much.

Whole runs drift (thermal state, neighbours, the network), so a series is judged on its own
run-to-run noise, not on a fixed number. The detection is `ruptures`_' PELT with the robust
L1 cost (a median per segment): a single bad night moves no median, and every segment holds at
least two runs, so one outlier is never a change. Levels are logarithms, so a 10% step is the
same size at any magnitude. The penalty grows with the series' length (``PENALTY * log n``,
in units of the noise), and a change point whose step is smaller than the metric's threshold or
:data:`K_NOISE` times the noise is merged away: what is left is a change users would act on.

Pure functions over plain sequences; :mod:`pytest_kimi.judge.history.gate` puts them to work.

.. _ruptures: https://centre-borelli.github.io/ruptures-docs/
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

K_NOISE = 3.0  # a change must exceed this many run-to-run standard deviations
PENALTY = 2.5  # x log(n), in units of the noise: what a change point must save (benchmarks/)
MIN_SEGMENT = 2  # runs per level: one night alone is an outlier, never a change
NOISE_FLOOR = 1e-4  # a relative spread below 0.01% is a deterministic backend, not zero
FLOOR = 1e-12  # a zero throughput as a level (its logarithm)
MIN_DIFFERENCES = 5  # a spread from fewer is a guess (3 sigma of it cries wolf): not used


@dataclass(frozen=True)
class Change:
    """The level of a series moved at run ``index`` (the first run of the new level)."""

    index: int
    before: float  # the level (median) of the runs since the previous change
    after: float  # the level of the runs from this change to the next
    worse: float  # relative change, signed so that positive is worse

    @property
    def direction(self) -> str:
        return "worse" if self.worse > 0 else "better"


def logs(values: Sequence[float]) -> np.ndarray:
    """The series as logarithms (a zero as a tiny positive level)."""
    return np.log(np.maximum(np.asarray(values, dtype=float), FLOOR))


def noise(values: Sequence[float], starts: Sequence[int] = ()) -> float | None:
    """The run-to-run spread, as a relative standard deviation: the median absolute difference
    of neighbouring runs in the same segment (``starts`` are the changes' indices), scaled to
    a normal's sigma. Robust to outliers and steps; None with fewer than
    :data:`MIN_DIFFERENCES` differences (the metric's threshold then decides alone)."""
    y = logs(values)
    cuts = set(starts)
    diffs = [y[i] - y[i - 1] for i in range(1, len(y)) if i not in cuts]
    if len(diffs) < MIN_DIFFERENCES:
        return None
    sigma = 1.4826 * float(np.median(np.abs(diffs))) / math.sqrt(2)
    return max(sigma, NOISE_FLOOR)


def change_points(
    values: Sequence[float], higher_is_better: bool, threshold: float = 0.0
) -> list[Change]:
    """Every change in ``values`` (oldest first) whose step is larger than ``threshold``
    (relative) and :data:`K_NOISE` times the series' noise, oldest first."""
    n = len(values)
    if n < 2 * MIN_SEGMENT:
        return []
    first = noise(values)
    if first is None:  # too few runs to know the noise: no change point claimed yet
        return []
    starts = _segment(logs(values), first)
    sigma = noise(values, starts) or first  # the spread inside the levels found
    limit = max(threshold, math.expm1(K_NOISE * sigma))
    while True:
        changes = _changes(values, starts, higher_is_better)
        small = [c for c in changes if abs(c.worse) <= limit]
        if not small:
            return changes
        weakest = min(small, key=lambda c: abs(c.worse))
        starts = [s for s in starts if s != weakest.index]  # merge its two levels, look again


def _segment(y: np.ndarray, sigma: float) -> list[int]:
    import ruptures

    algo = ruptures.Pelt(model="l1", min_size=MIN_SEGMENT, jump=1).fit((y / sigma)[:, None])
    ends = algo.predict(pen=PENALTY * math.log(len(y)))
    return [int(end) for end in ends[:-1]]  # the last end is the series' length


def _changes(
    values: Sequence[float], starts: Sequence[int], higher_is_better: bool
) -> list[Change]:
    bounds = [0, *starts, len(values)]
    levels = [level(values[a:b]) for a, b in pairwise(bounds)]
    return [
        Change(start, before, after, relative_worse(before, after, higher_is_better))
        for start, (before, after) in zip(starts, pairwise(levels), strict=True)
    ]


def level(values: Sequence[float]) -> float:
    """A segment's level: its median (one bad night does not move it)."""
    return float(np.median(np.asarray(values, dtype=float)))


def relative_worse(before: float, after: float, higher_is_better: bool) -> float:
    """``after`` against ``before``, signed so that positive is worse (NaN without a level)."""
    if before == 0 or math.isnan(before) or math.isnan(after):
        return math.nan
    raw = (after - before) / before
    return -raw if higher_is_better else raw


def segments(n: int, changes: Sequence[Change]) -> list[tuple[int, int]]:
    """The runs of each level as (start, end) index ranges, oldest first."""
    bounds = [0, *(c.index for c in changes), n]
    return list(pairwise(bounds))
