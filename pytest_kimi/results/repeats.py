"""``--kimi-repeat N``: one workload point measured N times, and what the runs say together.

One run's figures carry its requests' noise, which a bootstrap or an order statistic bounds.
They do not carry what changes from one run to the next: where the weights landed, the NCCL
rings, the cache state, a neighbour on the fabric. Repeats measure that. Per metric, over the
runs' own figures: the between-run mean, the sample standard deviation (``n - 1``), the
coefficient of variation (sd / mean) and Student's t interval of the mean,
``mean +- t((1 + C) / 2, n - 1) * sd / sqrt(n)`` (two-sided at ``C``; a few runs' figures are
near normal, and with 2-5 runs nothing else has a usable interval).

A repeated point's own figures pool its runs' requests (every latency distribution, the SLO
verdicts, the comparison's bootstrap deltas), except the figures of one whole run, which a
pool of runs does not have: the duration, throughputs, goodput and peak concurrency are the
runs' means (their pooled span would count the pauses between runs).

A regression gate with repeats judges the between-run mean by the between-run spread
(:func:`change_interval`): Welch's t interval when both sides were repeated, the one-sample t
interval against the other side's figure when only one was.

Pure functions; ``scipy.stats`` is imported where a quantile is needed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.results.summary import Summary

# a run's figures that a pool of runs has no value for: each run's, averaged
WHOLE_RUN = (
    "duration_s", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "goodput", "peak_concurrency", "peak_concurrency_bucketed",
)  # fmt: skip
DEFAULT_LEVEL = 0.95  # the t interval's two-sided level when no --kimi-confidence is set


@dataclass(frozen=True)
class Spread:
    """One metric over the runs of a point: each run's figure, their mean, standard deviation
    (``n - 1``), coefficient of variation, and the t interval of the mean at ``confidence``
    (two-sided; NaN with one run)."""

    values: tuple[float, ...]
    mean: float
    sd: float
    cv: float
    lower: float
    upper: float
    confidence: float

    @property
    def runs(self) -> int:
        return len(self.values)

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {"runs": self.runs, "values": list(self.values), "mean": num(self.mean),
                "sd": num(self.sd), "cv": num(self.cv), "lower": num(self.lower),
                "upper": num(self.upper), "confidence": self.confidence}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spread:
        def num(x: float | None) -> float:
            return math.nan if x is None else float(x)

        return cls(tuple(float(v) for v in data["values"]), num(data["mean"]), num(data["sd"]),
                   num(data["cv"]), num(data["lower"]), num(data["upper"]),
                   float(data["confidence"]))  # fmt: skip


def t_quantile(level: float, df: float) -> float:
    """Student's t quantile at ``level`` with ``df`` degrees of freedom (Welch's are not whole)."""
    from scipy import stats

    return float(stats.t.ppf(level, df))


def spread(values: Sequence[float], confidence: float = DEFAULT_LEVEL) -> Spread:
    """:class:`Spread` of the runs' ``values`` of one metric (every one finite)."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return Spread(tuple(values), mean, math.nan, math.nan, math.nan, math.nan, confidence)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    if sd <= 1e-12 * abs(mean):  # equal runs (a seeded mock): rounding, not spread
        sd = 0.0
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    cv = sd / abs(mean) if mean else math.nan
    return Spread(tuple(values), mean, sd, cv, mean - half, mean + half, confidence)


def spreads(
    runs: Sequence[Summary], names: Sequence[str], confidence: float = DEFAULT_LEVEL
) -> dict[str, Spread]:
    """Each named metric's :class:`Spread` over the runs' summaries; a metric some run has no
    finite figure for is left out (a mean of the others would hide that run)."""
    out: dict[str, Spread] = {}
    for name in names:
        values = []
        for summary in runs:
            try:
                values.append(float(summary.metric(name)))
            except KeyError:
                break
        if len(values) == len(runs) and all(math.isfinite(v) for v in values):
            out[name] = spread(values, confidence)
    return out


def pooled(summary: Summary, runs: Sequence[Summary]) -> Summary:
    """The summary of the runs' pooled requests, with each whole-run figure the runs' mean."""
    means: dict[str, Any] = {}
    for attr in WHOLE_RUN:
        values = [float(getattr(run, attr)) for run in runs]
        mean = sum(values) / len(values)
        means[attr] = round(mean) if attr.startswith("peak_") else mean
    return dataclasses.replace(summary, **means)


def change_interval(
    reference: Sequence[float], current: Sequence[float], level: float, worse_if_lower: bool
) -> tuple[float, float] | None:
    """The two-sided ``level`` interval of the relative change from the reference's mean to
    the current's, signed so that positive is worse, from the runs' spread: Welch's t when
    both sides have two runs or more, else the one-sample t of the side that has (against the
    other's one figure). None when neither side has two runs, or the reference is zero."""
    if len(reference) < 2 and len(current) < 2:
        return None
    ref, cur = spread(reference), spread(current)
    if ref.mean == 0 or math.isnan(ref.mean) or math.isnan(cur.mean):
        return None
    parts = [(s.sd**2 / s.runs, s.runs - 1) for s in (ref, cur) if s.runs >= 2]
    var = sum(v for v, _ in parts)
    if var == 0:
        low = high = cur.mean - ref.mean
    else:  # Welch-Satterthwaite degrees of freedom (one side: its own n - 1)
        df = var**2 / sum(v**2 / d for v, d in parts)
        half = t_quantile((1 + level) / 2, df) * math.sqrt(var)
        low, high = cur.mean - ref.mean - half, cur.mean - ref.mean + half
    low, high = low / abs(ref.mean), high / abs(ref.mean)
    return (-high, -low) if worse_if_lower else (low, high)
