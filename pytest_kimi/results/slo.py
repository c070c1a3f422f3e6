"""SLO specs (``ttft_p95=25s``) and their verdicts against a run's summary.

Latency SLOs are upper bounds in milliseconds ("25s", "150ms" or a bare number of ms);
throughputs, success rate and goodput are lower bounds. A verdict carries the measured value,
the limit and the margin, so a failure message says by how much.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kimi.results import catalogue

if TYPE_CHECKING:
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


@dataclass(frozen=True)
class Verdict:
    """The outcome of one SLO on one layout."""

    slo: Slo
    measured: float

    @property
    def passed(self) -> bool:
        if math.isnan(self.measured):
            return False
        return (
            self.measured <= self.slo.limit if self.slo.upper else self.measured >= self.slo.limit
        )

    @property
    def margin(self) -> float:
        """Positive when passing: how far the measurement is from the limit."""
        diff = self.slo.limit - self.measured
        return diff if self.slo.upper else -diff

    def message(self) -> str:
        unit = self.slo.unit
        state = "met" if self.passed else "VIOLATED"
        rel = ""
        if self.slo.limit and not math.isnan(self.measured):
            rel = f" ({self.margin / self.slo.limit:+.1%})"
        return (
            f"SLO {self.slo.describe()} {state}: measured {format_value(self.measured, unit)}, "
            f"margin {format_value(self.margin, unit)}{rel} [from {self.slo.source}]"
        )


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


def evaluate(slo: Slo, summary: Summary) -> Verdict:
    """Measure ``slo``'s metric on ``summary`` (NaN when nothing was measured: a failure)."""
    return Verdict(slo, summary.metric(slo.name))
