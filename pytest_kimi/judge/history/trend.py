"""One metric's trend across the history's runs: its values, levels, noise and change points.

A trend is what the history gate judges tonight against (:mod:`pytest_kimi.judge.history.gate`),
what ``python -m pytest_kimi.judge.history PATH changes`` lists and what the report plots: one
cluster, one experiment (the same workload, prompts and timing), one (layout, point), one
metric, oldest run first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kimi.judge.history.changes import K_NOISE, Change, change_points, level, noise, segments
from pytest_kimi.judge.history.store import History, RunRecord, SeriesEntry, SeriesKey
from pytest_kimi.results import catalogue

THROUGHPUT_FLOOR = 0.01  # a throughput's limit from the spread is never below 1%


def floor_of(metric: str, threshold: float) -> float:
    """The smallest relative step that counts: the metric's threshold, or for a throughput
    (one number per run) :data:`THROUGHPUT_FLOOR`, so that its history's spread decides."""
    return threshold if catalogue.metric(metric).per_request else THROUGHPUT_FLOOR


def limit_of(metric: str, threshold: float, sigma: float | None, nights: int = 1) -> float:
    """The relative change that counts: :func:`floor_of` or K_NOISE x the spread of
    ``nights`` nights' mean, whichever is larger; without a spread yet, the threshold."""
    if sigma is None:
        return threshold
    return max(floor_of(metric, threshold), math.expm1(K_NOISE * sigma / math.sqrt(nights)))


@dataclass(frozen=True)
class Trend:
    """A metric's measured runs, oldest first, cut into levels at its change points."""

    case: str  # tp32, or tp32-c8
    metric: str
    entries: Sequence[SeriesEntry]  # the runs that measured it
    changes: Sequence[Change] = ()
    noise: float | None = None  # run-to-run spread, relative sigma; None under 3 runs
    limit: float = 0.0  # the relative step that counts (:func:`limit_of`)
    cluster: str = ""
    experiment: str = ""
    levels: Sequence[tuple[int, int, float]] = field(default=())  # (start, end, median)

    @classmethod
    def of(
        cls, case: str, metric: str, series: Sequence[SeriesEntry], threshold: float, **where: str
    ) -> Trend:
        """The trend of ``series`` (a history series, oldest first); ``threshold`` is the
        metric's gate threshold (``--kimi-fail``)."""
        entries = [e for e in series if e.value is not None]
        values = [float(e.value) for e in entries]  # type: ignore[arg-type]
        higher_is_better = catalogue.metric(metric).higher_is_better
        changes = change_points(values, higher_is_better, floor_of(metric, threshold))
        sigma = noise(values, [c.index for c in changes])
        spans = segments(len(values), changes) if values else []
        levels = tuple((a, b, level(values[a:b])) for a, b in spans)
        return cls(case, metric, entries, tuple(changes), sigma,
                   limit_of(metric, threshold, sigma), levels=levels, **where)  # fmt: skip

    @property
    def values(self) -> list[float]:
        return [float(e.value) for e in self.entries]  # type: ignore[arg-type]

    @property
    def runs(self) -> list[RunRecord]:
        return [e.run for e in self.entries]


def trend_of(
    history: History,
    key: SeriesKey,
    metric: str,
    threshold: float,
    *,
    since: str | None = None,
    window: int | None = None,
) -> Trend:
    """The trend of one series' ``metric``: its runs from the run ``since`` on (a uid), the
    last ``window`` of them; ``threshold`` is the metric's gate threshold."""
    series = history.series(key.experiment, key.layout, key.point, metric,
                            cluster=key.cluster, since=since)  # fmt: skip
    return Trend.of(key.case, metric, series[-window:] if window else series, threshold,
                    cluster=key.cluster, experiment=key.experiment)  # fmt: skip


def trends(
    history: History, cluster: str | None = None, thresholds: dict[str, float] | None = None
) -> list[Trend]:
    """Every gated metric's trend in the store (or on one cluster), over all its runs: per
    cluster, experiment, (layout, point) and metric the results hold. ``thresholds`` are the
    gate's (default: :data:`pytest_kimi.results.catalogue.DEFAULT_THRESHOLDS`, as ``changes``
    uses)."""
    limits = catalogue.DEFAULT_THRESHOLDS if thresholds is None else thresholds
    found = (trend_of(history, key, metric, limits[metric])
             for key in history.experiments(cluster) for metric in sorted(limits))  # fmt: skip
    return [trend for trend in found if trend.entries]


def trend_data(trend: Trend) -> dict[str, Any]:
    """A trend as the report's model holds it (JSON): each run's id, time and value, the
    levels with their noise band, and the change points."""
    band = math.expm1(K_NOISE * trend.noise) if trend.noise is not None else None
    return {
        "runs": [r.run_id for r in trend.runs],
        "finished_at": [r.finished_at for r in trend.runs],
        "values": trend.values,
        "levels": [
            {
                "start": a,
                "end": b,
                "level": value,
                "band": None if band is None else [value / (1 + band), value * (1 + band)],
            }
            for a, b, value in trend.levels
        ],
        "noise": trend.noise,
        "limit": trend.limit,
        "changes": [change_data(trend, c) for c in trend.changes],
    }


def change_data(trend: Trend, change: Change) -> dict[str, Any]:
    """A change point as JSON (the report's model, ``history changes --json``)."""
    return {
        "index": change.index,
        "run_id": trend.runs[change.index].run_id,
        "before": change.before,
        "after": change.after,
        "change": change.worse,
        "direction": change.direction,
    }


def report_trends(
    history: History,
    keys: Sequence[SeriesKey],
    thresholds: Mapping[str, float],
    *,
    since: str | None = None,
    window: int | None = None,
) -> list[dict[str, Any]]:
    """The report's trend section: per gated metric, the trend of each series in ``keys`` (this
    run's cases) as the history gate reads it, for the cases with at least one run."""
    out = []
    for metric in sorted(thresholds):
        found = (trend_of(history, key, metric, thresholds[metric], since=since, window=window)
                 for key in keys)  # fmt: skip
        cases = {trend.case: trend_data(trend) for trend in found if trend.entries}
        if cases:
            out.append({"metric": metric, "cases": cases})
    return out
