"""SLO specs (``ttft_p95=25s``) and their verdicts against a run's summary.

Latency SLOs are upper bounds in milliseconds ("25s", "150ms" or a bare number of ms);
throughputs, success rate and goodput are lower bounds. A verdict carries the measured value,
the limit and the margin, so a failure message says by how much.

At a confidence (``--kimi-confidence``) a verdict compares bounds, not the point
(:mod:`pytest_kimi.results.intervals`): passed, failed or undecided, with the interval and,
when undecided, how many requests a decision would likely need. Figures of the run as a
whole (throughputs, goodput) and ITL (its samples are the tokens of a few requests, not
independent) have no interval: they are compared as before, and the verdict says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kimi.results import catalogue
from pytest_kimi.results import intervals as iv

if TYPE_CHECKING:
    from pytest_kimi.results.sequential import Look
    from pytest_kimi.results.summary import Summary

_FLOORS = tuple(n for n, m in catalogue.AGGREGATES.items() if catalogue.sloable(m))
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(ms|s|min)?\s*$")
_UNIT_MS = {None: 1.0, "ms": 1.0, "s": 1000.0, "min": 60000.0}


class SloError(ValueError):
    """An SLO that cannot be understood; the message names it and where it came from."""


@dataclass(frozen=True)
class Slo:
    """``metric`` must stay below (latency) or above (throughput) ``limit``."""

    name: str
    limit: float
    upper: bool
    unit: str
    source: str

    def describe(self) -> str:
        op = "<=" if self.upper else ">="
        return f"{self.name} {op} {format_value(self.limit, self.unit)}"


OUTCOMES = ("passed", "failed", "undecided")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one SLO on one layout. ``bounds``: the interval at a confidence, where
    one was asked for and the metric has one; ``needed``: when undecided, about how many
    requests would decide it (``intervals.NEVER``: none would); ``why``: what an undecided
    verdict, or one compared without an interval, should say."""

    slo: Slo
    measured: float
    bounds: iv.Bounds | None = None
    needed: int | None = None
    why: str = ""

    @property
    def outcome(self) -> str:
        """``passed``, ``failed`` or ``undecided`` (only with bounds)."""
        if math.isnan(self.measured):
            return "failed"
        if self.bounds is None:
            return "passed" if self._within(self.measured) else "failed"
        worst, best = (
            (self.bounds.upper, self.bounds.lower)
            if self.slo.upper
            else (self.bounds.lower, self.bounds.upper)
        )
        if self._within(worst):
            return "passed"
        if not self._within(best):
            return "failed"
        return "undecided"

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    def _within(self, value: float) -> bool:
        return value <= self.slo.limit if self.slo.upper else value >= self.slo.limit

    @property
    def margin(self) -> float:
        """Positive when passing: how far the measurement is from the limit."""
        diff = self.slo.limit - self.measured
        return diff if self.slo.upper else -diff

    def message(self) -> str:
        unit = self.slo.unit
        state = {"passed": "met", "failed": "VIOLATED", "undecided": "UNDECIDED"}[self.outcome]
        rel = ""
        if self.slo.limit and not math.isnan(self.measured):
            rel = f" ({self.margin / self.slo.limit:+.1%})"
        text = (
            f"SLO {self.slo.describe()} {state}: measured {format_value(self.measured, unit)}, "
            f"margin {format_value(self.margin, unit)}{rel}"
        )
        if self.bounds is not None:
            text += f", {self.interval_text()}"
        if self.why:
            text += f"; {self.why}"
        return f"{text} [from {self.slo.source}]"

    def interval_text(self) -> str:
        """``95% bounds 1.20 s .. 1.64 s (order statistics, 40 requests)``."""
        b = self.bounds
        assert b is not None
        unit = self.slo.unit
        if b.lower_confidence is None or b.upper_confidence is None:
            level = f"{b.confidence:.0%} bounds"
        else:  # a sequential look: each side at its spent level
            level = f"bounds at {b.lower_confidence:.2%} / {b.upper_confidence:.2%}"
        return (
            f"{level} {_bound(b.lower, unit)} .. {_bound(b.upper, unit)} "
            f"({b.method}, {b.n} requests)"
        )


def _bound(value: float, unit: str) -> str:
    return "no bound" if math.isinf(value) else format_value(value, unit)


def format_value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "ms":
        return f"{value / 1000:.2f} s" if abs(value) >= 1000 else f"{value:.1f} ms"
    return f"{value:.4g} {unit}".rstrip()


def parse_slo(name: str, value: str | float, source: str) -> Slo:
    """One SLO from ``name`` and a value such as ``25s``, ``150ms`` or ``0.99``.

    Which names are allowed, their unit and whether the limit is a ceiling or a floor all come
    from :mod:`pytest_kimi.results.catalogue`."""
    name = name.strip()
    text = str(value).strip()
    try:
        m = catalogue.metric(name)
    except catalogue.UnknownMetric as exc:
        if "percentile" in str(exc):  # a latency name with a percentile out of range
            raise SloError(f"{source}: SLO {name}: {str(exc).split(': ', 1)[1]}") from None
        known = ", ".join(["ttft_/tpot_/itl_/e2e_ + mean|median|pNN", *_FLOORS])
        raise SloError(f"{source}: unknown SLO metric {name!r} (known: {known})") from None
    if not catalogue.sloable(m):
        known = ", ".join(["ttft_/tpot_/itl_/e2e_ + mean|median|pNN", *_FLOORS])
        raise SloError(f"{source}: unknown SLO metric {name!r} (known: {known})")
    if m.unit == "ms":
        match = _DURATION.match(text)
        if not match:
            raise SloError(f"{source}: SLO {name}={text!r}: expected a duration like 25s or 150ms")
        limit_ms = float(match.group(1)) * _UNIT_MS[match.group(2)]
        return Slo(name, limit_ms, m.upper_bound, "ms", source)
    try:
        limit = float(text)
    except ValueError:
        raise SloError(f"{source}: SLO {name}={text!r}: expected a number") from None
    if not math.isfinite(limit) or limit < 0:
        raise SloError(f"{source}: SLO {name}={text!r}: expected a finite number >= 0")
    if name == "success_rate" and limit > 1:
        raise SloError(f"{source}: SLO {name}={text!r}: a rate between 0 and 1")
    return Slo(name, limit, m.upper_bound, "" if m.unit == "count" else m.unit, source)


def parse_confidence(value: str | float, source: str) -> float:
    """A confidence for SLO verdicts (``0.95``): over 0.5 (a one-sided bound at 0.5 or less
    is no bound) and under 1 (no finite run reaches certainty)."""
    try:
        confidence = float(value)
    except (TypeError, ValueError):
        raise SloError(f"{source}: confidence {value!r}: expected a number such as 0.95") from None
    if not 0.5 < confidence < 1:
        raise SloError(f"{source}: confidence {value!r}: expected a number over 0.5 and under 1")
    return confidence


def parse_assignment(text: str, source: str) -> tuple[str | None, Slo]:
    """``NAME=VALUE`` or ``LAYOUT:NAME=VALUE`` from the command line or an ini file."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise SloError(f"{source}: expected NAME=VALUE (e.g. ttft_p95=25s), got {text!r}")
    layout, colon, name = name.rpartition(":")
    return (layout.strip() if colon else None), parse_slo(name, value, source)


def merge(*layers: Iterable[Slo]) -> dict[str, Slo]:
    """Later layers override earlier ones by name (YAML, then ini, then command line)."""
    out: dict[str, Slo] = {}
    for layer in layers:
        for slo in layer:
            out[slo.name] = slo
    return out


def parse_duration_ms(text: str, source: str) -> float:
    """``25s`` / ``150ms`` / ``1.5min`` / bare ms -> milliseconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise SloError(f"{source}: {text!r}: expected a duration like 25s or 150ms")
    return float(match.group(1)) * _UNIT_MS[match.group(2)]


def from_mapping(values: Mapping[str, str], source: str) -> list[Slo]:
    return [parse_slo(name, value, f"{source} slo.{name}") for name, value in values.items()]


def percentiles_needed(slos: Iterable[Slo]) -> set[float]:
    """Percentiles the SLOs refer to (``ttft_p97`` -> 97.0), so the summary computes them."""
    out = set()
    for slo in slos:
        q = catalogue.metric(slo.name).percentile
        if q is not None:
            out.add(q)
    return out


def evaluate(
    slo: Slo,
    summary: Summary,
    samples: Mapping[str, Sequence[float]] | None = None,
    confidence: float | None = None,
    look: Look | None = None,
) -> Verdict:
    """Measure ``slo``'s metric on ``summary`` (NaN when nothing was measured: a failure);
    with a ``confidence``, bound it from the per-request ``samples`` (ms, keyed by latency
    prefix: :func:`pytest_kimi.results.metrics.per_request_ms`) where the metric has bounds;
    at a sequential ``look`` (``--kimi-until-decided``), each side at that look's level."""
    measured = summary.metric(slo.name)
    if confidence is None or math.isnan(measured):
        return Verdict(slo, measured)
    m = catalogue.metric(slo.name)
    sides = (1 - look.lower, 1 - look.upper) if look is not None else None
    if slo.name == "success_rate" and slo.limit >= 1:
        why = ("judged on this run's count: a 100% floor asks that every request sent "
               "succeeds, which no bound on a rate can show")  # fmt: skip
        return Verdict(slo, measured, why=why)
    if slo.name == "success_rate":
        bounds = iv.proportion_bounds(summary.completed, summary.completed + summary.failed,
                                      confidence, sides)  # fmt: skip
        return _decided(Verdict(slo, measured, bounds), None, look=look)
    values = (samples or {}).get(m.prefix) if m.per_request else None
    if not values or (bounded_percentile(slo) is None and m.stat != "mean"):
        why = "compared without an interval: " + (
            "a figure of the whole run" if not m.prefix else
            "its samples (a request's tokens) are not independent" if m.prefix == "itl" else
            f"no interval for {m.stat}"
        )  # fmt: skip
        return Verdict(slo, measured, why=why)
    if m.stat == "mean":
        bounds = iv.mean_bounds(values, confidence, sides)
        verdict = Verdict(slo, measured, bounds)
        return _decided(verdict, lambda: iv.mean_requests_needed(values, slo.limit, confidence),
                        look=look)  # fmt: skip
    percentile = bounded_percentile(slo) or 0.0
    bounds = iv.quantile_bounds(values, percentile, confidence, sides)
    verdict = Verdict(slo, measured, bounds)
    return _decided(
        verdict, lambda: iv.quantile_requests_needed(values, percentile, slo.limit, confidence),
        percentile, look,
    )


def has_bounds(slo: Slo) -> bool:
    """Whether a confidence bounds ``slo``: a success rate, or a percentile, median or mean
    of a per-request latency (not ITL)."""
    m = catalogue.metric(slo.name)
    mean = m.per_request and m.prefix != "itl" and m.stat == "mean"
    return slo.name == "success_rate" or mean or bounded_percentile(slo) is not None


def bounded_percentile(slo: Slo) -> float | None:
    """The percentile an SLO's order-statistic bounds are of (50 for a median); None for one
    on a mean, a rate or a whole-run figure."""
    m = catalogue.metric(slo.name)
    if not m.per_request or m.prefix == "itl":
        return None
    if m.stat == "median":
        return 50.0
    return m.percentile if m.is_percentile else None


def _decided(
    verdict: Verdict, needed: Callable[[], int] | None, percentile: float = 0,
    look: Look | None = None,
) -> Verdict:  # fmt: skip
    """``verdict`` with, when undecided, how many requests would likely decide it and why."""
    if verdict.outcome != "undecided":
        return verdict
    b = verdict.bounds
    assert b is not None
    # at a sequential look the levels are the look's, not C: no fixed-n estimate then
    count = needed() if needed is not None and look is None else None
    parts = []
    if look is not None:
        last = look.index + 1 == look.of
        parts.append(f"look {look.index + 1} of {look.of}, at {look.n} requests: the bounds "
                     + ("still straddle the limit at the last look" if last else
                        "straddle the limit"))  # fmt: skip
    elif percentile and math.isinf(b.upper if verdict.slo.upper else b.lower):
        fewest = iv.fewest_for_upper_bound(percentile, b.confidence)
        parts.append(
            f"{b.n} requests cannot bound a p{percentile:g} from above at {b.confidence:.0%} "
            f"(that needs {fewest}: {percentile / 100:g}^{fewest} < {1 - b.confidence:.2g}), "
            "so they can fail this SLO but never pass it"
        )
    else:
        parts.append(f"the {b.confidence:.0%} bounds straddle the limit")
    if count is not None:
        parts.append(
            "no number of requests like these would decide it (the limit sits at the measured "
            "value)" if count >= iv.NEVER else
            f"about {count} requests like these would decide it"
        )  # fmt: skip
    return Verdict(verdict.slo, verdict.measured, b, count, "; ".join(parts))
