"""What one layout's run produced, or why it produced nothing: the record every step shares.

Bring-up adds notes, measuring adds records and the summary, judging adds verdicts, the store
writes it and reads it back (:mod:`pytest_kimi.results.store`), the report renders it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_kimi.results.intervals import NEVER, Bounds
from pytest_kimi.results.slo import Slo, Verdict

if TYPE_CHECKING:
    from pytest_kimi.results.pdstages import StageTimes
    from pytest_kimi.results.records import RequestRecord
    from pytest_kimi.results.repeats import Spread
    from pytest_kimi.results.replicacounters import ReplicaCounters
    from pytest_kimi.results.summary import Summary
    from pytest_kimi.results.telemetry_stats import TelemetrySeries, TelemetrySummary


@dataclass
class LayoutResult:
    """One layout's outcome at one workload point. ``summary`` is None when the run did not
    finish (``error`` says why); ``records`` keep every request, the unfinished ones marked.
    ``replica_counters``: each replica's requests and tokens over the measured run, from its
    own counters (real SGLang names no replica per request). ``telemetry``: the GPU figures
    over the measured run, where the nodes were sampled; ``telemetry_series`` the samples (for
    the plots)."""

    name: str
    label: str
    summary: Summary | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    error: str = ""
    result_dir: str = ""
    notes: list[str] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    replica_counters: dict[str, ReplicaCounters] = field(default_factory=dict)
    telemetry: TelemetrySummary | None = None
    telemetry_series: TelemetrySeries | None = field(default=None, repr=False)
    point: str = ""  # the workload point's id ("" when the run has one point)
    point_settings: dict[str, Any] = field(default_factory=dict)  # what the point sets
    # a disaggregated layout: SGLang's per-stage latencies over the run (where TTFT goes)
    stage_times: StageTimes | None = None
    # --kimi-until-decided: the look (0-based) each SLO was decided at, or the last one
    looks: dict[str, int] | None = None
    # --kimi-repeat: each run's summary (``summary`` then pools their requests), and per
    # metric the spread of the runs' figures
    repeats: list[Summary] = field(default_factory=list, repr=False)
    between_runs: dict[str, Spread] = field(default_factory=dict, repr=False)

    @property
    def case(self) -> str:
        """``tp32``, or ``tp32-c8`` at one of several workload points: test ids, keys."""
        return f"{self.name}-{self.point}" if self.point else self.name

    @property
    def complete(self) -> bool:
        return self.summary is not None and not self.error

    @property
    def runs(self) -> int:
        """How many runs the figures rest on (``--kimi-repeat``; 1 otherwise)."""
        return max(1, len(self.repeats))


def verdict_to_dict(verdict: Verdict) -> dict[str, Any]:
    """A verdict as ``summary.json`` and ``comparison.json`` store it; at a confidence, with
    its bounds (null where the data allow none), the requests a decision would need and why."""
    out = {
        "name": verdict.slo.name,
        "limit": verdict.slo.limit,
        "unit": verdict.slo.unit,
        "upper_bound": verdict.slo.upper,
        "source": verdict.slo.source,
        "measured": None if math.isnan(verdict.measured) else verdict.measured,
        "passed": verdict.passed,
        "outcome": verdict.outcome,
    }
    if verdict.bounds is not None:
        b = verdict.bounds
        out["interval"] = {
            "lower": None if math.isinf(b.lower) else b.lower,
            "upper": None if math.isinf(b.upper) else b.upper,
            "confidence": b.confidence, "method": b.method, "requests": b.n,
        }  # fmt: skip
        if b.lower_confidence is not None:  # a sequential look's own levels
            out["interval"]["lower_confidence"] = b.lower_confidence
            out["interval"]["upper_confidence"] = b.upper_confidence
    if verdict.needed is not None:
        out["requests_needed"] = verdict.needed if verdict.needed < NEVER else None
    if verdict.why:
        out["why"] = verdict.why
    return out


def verdict_from_dict(entry: dict[str, Any]) -> Verdict:
    """The inverse of :func:`verdict_to_dict` (the verdict as judged at the time)."""
    slo = Slo(
        entry["name"],
        entry["limit"],
        entry["upper_bound"],
        entry["unit"],
        entry.get("source", "saved run"),
    )
    measured = entry["measured"]
    bounds = None
    if (interval := entry.get("interval")) is not None:
        lower, upper = interval["lower"], interval["upper"]
        bounds = Bounds(
            -math.inf if lower is None else lower, math.inf if upper is None else upper,
            interval["confidence"], interval["method"], interval["requests"],
            interval.get("lower_confidence"), interval.get("upper_confidence"),
        )  # fmt: skip
    needed = None
    if "requests_needed" in entry:  # null: no number of requests would decide it
        needed = NEVER if entry["requests_needed"] is None else entry["requests_needed"]
    return Verdict(slo, float("nan") if measured is None else measured, bounds,
                   needed, entry.get("why", ""))  # fmt: skip
