"""The nightly regression gate: store a run as a baseline, judge later runs against it.

Direction-aware (latency up or throughput down is a regression) and noise-aware: a latency
regression must exceed its threshold AND its 95% bootstrap interval must exclude zero, so 40
noisy requests do not page anyone; throughputs (one number per run) are judged on the
threshold alone. Pure functions over plain data plus the two file operations.

At a confidence ``C`` (``--kimi-confidence``) the verdict has three values, as an SLO's does
(:mod:`pytest_kimi.results.slo`): the bootstrap bounds of the change, each one-sided at ``C``,
against the threshold. All of the interval over it: failed; all of it at or under: passed;
straddling it: undecided, never a coin toss. A throughput, one figure per run, has no interval:
its point comparison decides, and its message says so.

Repeated runs (``--kimi-repeat``, on either side): each side's figure is its runs' mean, and
the interval of the change is the runs' t interval (:func:`pytest_kimi.results.repeats.
change_interval`), for throughputs too: the run-to-run spread, which a bootstrap of one run's
requests cannot see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.results import catalogue
from pytest_kimi.results.repeats import change_interval
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
    confidence: float | None = None  # --kimi-confidence: bounds one-sided at it, three values
    runs: tuple[int, int] | None = None  # --kimi-repeat: the interval is the runs' t interval

    @property
    def change(self) -> float:
        """Relative change, signed so that positive is worse."""
        if self.baseline == 0 or math.isnan(self.baseline) or math.isnan(self.current):
            return math.nan
        raw = (self.current - self.baseline) / self.baseline
        return -raw if catalogue.metric(self.metric).higher_is_better else raw

    @property
    def outcome(self) -> str:
        """``passed``, ``failed`` or (at a confidence) ``undecided``."""
        return gate_outcome(self.change, self.threshold, self.interval, self.confidence)

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.ci_low is None or self.ci_high is None else (self.ci_low,
                                                                         self.ci_high)

    @property
    def regressed(self) -> bool:
        return self.outcome == "failed"

    def message(self) -> str:
        worse = "worse" if self.change > 0 else "better"
        ci = interval_words(self.interval, self.confidence, self.outcome, self.threshold,
                            runs=self.runs)  # fmt: skip
        return (
            f"{VERDICT_WORDS[self.outcome]}: {self.layout} {self.metric} {self.current:.4g} vs "
            f"baseline {self.baseline:.4g} ({abs(self.change):.1%} {worse}; threshold "
            f"{self.threshold:.0%}{ci})"
        )


VERDICT_WORDS = {"passed": "ok", "failed": "REGRESSION", "undecided": "UNDECIDED"}


def gate_outcome(
    change: float,
    limit: float,
    interval: tuple[float, float] | None,
    confidence: float | None,
) -> str:
    """A regression verdict from the change (positive: worse), the limit it may not exceed,
    and the bootstrap interval of the change where the metric has per-request values.

    Without a confidence: failed when the change exceeds the limit and its interval (95%,
    two-sided) lies wholly on the worse side (beyond noise). At a confidence: failed when the
    interval's lower bound exceeds the limit, passed when its upper bound does not, undecided
    between; without an interval the point change decides."""
    if math.isnan(change):
        return "failed"  # a metric we can no longer measure is not a pass
    if interval is None:
        return "failed" if change > limit else "passed"
    low, high = interval
    if confidence is None:
        return "failed" if change > limit and low > 0 else "passed"
    if low > limit:
        return "failed"
    return "passed" if high <= limit else "undecided"


def bootstrap_level(confidence: float | None) -> float:
    """The two-sided level of a change's bootstrap interval: each side one-sided at the
    confidence (``2C - 1``); 95% where none is set."""
    return 0.95 if confidence is None else 2 * confidence - 1


def interval_words(
    interval: tuple[float, float] | None,
    confidence: float | None,
    outcome: str,
    limit: float,
    lead: str = ", ",
    runs: tuple[int, int] | None = None,
) -> str:
    """The interval of a change as a message's clause after ``lead`` (empty without one);
    ``runs``: it is the between-run t interval of (reference, current) runs."""
    if interval is None:
        return f"{lead}one figure per run: no interval" if confidence is not None else ""
    low, high = interval
    basis = f" (t, between {runs[0]} and {runs[1]} runs)" if runs else ""
    if confidence is None:
        return f"{lead}95% interval of the change [{low:+.1%}, {high:+.1%}]{basis}"
    text = f"{lead}{confidence:.0%} bounds of the change [{low:+.1%}, {high:+.1%}]{basis}"
    if outcome == "undecided":
        more = "more runs" if runs else "more requests per run"
        text += f" straddle the limit {limit:+.1%}: {more} would decide it"
    return text


def judge(
    layout: str,
    metric: str,
    threshold: float,
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    seed: int = 0,
    confidence: float | None = None,
) -> Judgement:
    """Compare one metric; ``baseline``/``current`` are a layout's snapshot entries;
    ``confidence``: ``--kimi-confidence`` (None: the plain comparison)."""
    base_value = _value(baseline, metric)
    cur_value = _value(current, metric)
    m = catalogue.metric(metric)
    runs = [list(entry.get("runs", {}).get(metric) or []) for entry in (baseline, current)]
    if max(len(r) for r in runs) >= 2:  # repeats: the runs' spread, not the requests'
        ci = change_interval(runs[0] or [base_value], runs[1] or [cur_value],
                             bootstrap_level(confidence), m.higher_is_better)  # fmt: skip
        if ci is not None:
            count = (max(1, len(runs[0])), max(1, len(runs[1])))
            return Judgement(layout, metric, base_value, cur_value, threshold, *ci, confidence,
                             count)  # fmt: skip
    if m.per_request:
        prefix, stat = m.prefix, m.stat
        a = baseline.get("samples", {}).get(prefix) or []
        b = current.get("samples", {}).get(prefix) or []
        ci = bootstrap_delta(a, b, stat, seed=seed, confidence=bootstrap_level(confidence))
        if ci is not None:
            low, high = (-ci.high, -ci.low) if m.higher_is_better else (ci.low, ci.high)
            return Judgement(layout, metric, base_value, cur_value, threshold, low, high,
                             confidence)  # fmt: skip
    return Judgement(layout, metric, base_value, cur_value, threshold, confidence=confidence)


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
