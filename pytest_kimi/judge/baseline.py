"""The nightly regression gate: store a run as a baseline, judge later runs against it.

Direction-aware (latency up or throughput down is a regression) and noise-aware: a latency
regression must exceed its threshold AND its 95% bootstrap interval must exclude zero, so 40
noisy requests do not page anyone; throughputs (one number per run) are judged on the
threshold alone. Pure functions over plain data plus the two file operations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.results import catalogue
from pytest_kimi.results.stats import bootstrap_delta

DEFAULT_THRESHOLDS = catalogue.DEFAULT_THRESHOLDS


@dataclass(frozen=True)
class Judgement:
    """One metric of one layout against the baseline."""

    layout: str
    metric: str
    baseline: float
    current: float
    threshold: float
    ci_low: float | None = None
    ci_high: float | None = None

    @property
    def change(self) -> float:
        """Relative change, signed so that positive is worse."""
        if self.baseline == 0 or math.isnan(self.baseline) or math.isnan(self.current):
            return math.nan
        raw = (self.current - self.baseline) / self.baseline
        return -raw if catalogue.metric(self.metric).higher_is_better else raw

    @property
    def beyond_noise(self) -> bool:
        """For latencies: the bootstrap interval of the change lies wholly on the worse side."""
        if self.ci_low is None:
            return True  # no per-request samples (throughputs): the threshold alone decides
        return self.ci_low > 0

    @property
    def regressed(self) -> bool:
        if math.isnan(self.change):
            return True  # a metric we can no longer measure is not a pass
        return self.change > self.threshold and self.beyond_noise

    def message(self) -> str:
        worse = "worse" if self.change > 0 else "better"
        ci = ""
        if self.ci_low is not None:
            ci = f", 95% interval of the change [{self.ci_low:+.1%}, {self.ci_high:+.1%}]"
        verdict = "REGRESSION" if self.regressed else "ok"
        return (
            f"{verdict}: {self.layout} {self.metric} {self.current:.4g} vs baseline "
            f"{self.baseline:.4g} ({abs(self.change):.1%} {worse}; threshold "
            f"{self.threshold:.0%}{ci})"
        )


def judge(
    layout: str,
    metric: str,
    threshold: float,
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    seed: int = 0,
) -> Judgement:
    """Compare one metric; ``baseline``/``current`` are a layout's snapshot entries."""
    base_value = _value(baseline, metric)
    cur_value = _value(current, metric)
    m = catalogue.metric(metric)
    if m.per_request:
        prefix, stat = m.prefix, m.stat
        a = baseline.get("samples", {}).get(prefix) or []
        b = current.get("samples", {}).get(prefix) or []
        ci = bootstrap_delta(a, b, stat, seed=seed)
        if ci is not None:
            return Judgement(layout, metric, base_value, cur_value, threshold, ci.low, ci.high)
    return Judgement(layout, metric, base_value, cur_value, threshold)


def _value(entry: Mapping[str, Any], metric: str) -> float:
    value = entry.get("metrics", {}).get(metric)
    return math.nan if value is None else float(value)


def metrics_of(summary: Any, names: Sequence[str]) -> dict[str, float | None]:
    """The named metrics of a Summary, NaN as None (JSON)."""
    out: dict[str, float | None] = {}
    for name in names:
        try:
            value = float(summary.metric(name))
        except KeyError:
            value = math.nan
        out[name] = None if math.isnan(value) else value
    return out
