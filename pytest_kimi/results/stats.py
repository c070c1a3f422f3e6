"""Bootstrap confidence intervals for the difference between two layouts' statistics.

With 40 requests a p95 rests on two or three of them; a reader must see whether a difference
is larger than what resampling the same requests would give. Percentile bootstrap, seeded so a
report renders the same twice: resample each layout's per-request values with replacement,
compute the statistic on both, and take the 2.5th and 97.5th percentiles of the relative
difference. Pure functions over arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True)
class DeltaCI:
    """Relative difference ``(b - a) / a`` of a statistic, with its confidence interval."""

    delta: float
    low: float
    high: float
    confidence: float

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly on one side of zero: a real difference."""
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, float | bool]:
        return {
            "delta": self.delta,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "excludes_zero": self.excludes_zero,
        }


def statistic(values: np.ndarray, name: str) -> np.ndarray:
    """``mean``, ``median`` or ``pNN`` along the last axis (numpy linear percentiles)."""
    if name == "mean":
        return values.mean(axis=-1)
    if name == "median":
        return np.median(values, axis=-1)
    if name.startswith("p"):
        return np.percentile(values, float(name[1:]), axis=-1)
    raise ValueError(f"unknown statistic {name!r}: mean, median or pNN")


def bootstrap_against(
    values: Sequence[float],
    reference: float,
    stat: str,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """CI of ``stat(values) / reference - 1`` over resamples of ``values`` alone: a run's
    requests against a fixed level (a history's median); None with < 2 values or no level."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or reference == 0 or not np.isfinite(reference):
        return None
    rng = np.random.default_rng(seed)
    rel = statistic(x[rng.integers(0, x.size, size=(resamples, x.size))], stat) / reference - 1
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(rel, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_delta(
    a: Sequence[float],
    b: Sequence[float],
    stat: str,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> DeltaCI | None:
    """CI of ``(stat(b) - stat(a)) / stat(a)``; None when either side has < 2 values."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return None
    base = float(statistic(xa, stat))
    if base == 0:
        return None
    delta = (float(statistic(xb, stat)) - base) / base
    rng = np.random.default_rng(seed)
    sa = statistic(xa[rng.integers(0, xa.size, size=(resamples, xa.size))], stat)
    sb = statistic(xb[rng.integers(0, xb.size, size=(resamples, xb.size))], stat)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = (sb - sa) / sa
    rel = rel[np.isfinite(rel)]
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(rel, [tail, 100 - tail])
    return DeltaCI(delta, float(low), float(high), confidence)
