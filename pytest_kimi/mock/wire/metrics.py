"""The mock's ``/metrics`` as a real server of its wire version exports it.

Families, their order, help text, label names, histogram buckets and the label sets a ready
server shows come from the version's recording (:mod:`pytest_kimi.mock.wire`); the values are
the mock's. A family is written only once it has a sample, as SGLang's multiprocess
collector writes it: a counter SGLang creates on its first increment (an abort, a streamed
request's ``is_streaming="true"``) appears here on the mock's first one too.

Callers name a family and the labels they know (``is_streaming="true"``, ``endpoint=...``);
the rest come from the family's own label set in the recording, so the same call fits every
version, and a label or family a version lacks is left out (a call on a family the version
does not export does nothing).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from pytest_kimi.mock.wire import Family, Recording

Labels = tuple[tuple[str, str], ...]


@dataclass
class Histogram:
    """One histogram series: a count per bucket (not cumulative), the sum of observations."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0.0] * len(self.bounds)

    def observe(self, value: float, times: float = 1.0) -> None:
        index = min(bisect_left(self.bounds, value), len(self.bounds) - 1)
        self.counts[index] += times


def number(value: float) -> str:
    """A sample value as Prometheus' text format (and prometheus_client) writes it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _bound(le: str) -> float:
    return math.inf if le == "+Inf" else float(le)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _text_labels(labels: Labels, extra: str = "") -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    inner = ",".join(x for x in (inner, extra) if x)
    return "{" + inner + "}" if inner else ""


class MetricStore:
    """Every series of a server, by family; :meth:`render` writes the exposition text."""

    def __init__(self, rec: Recording, fill: Mapping[str, str], own: Collection[str] = ()) -> None:
        """``fill``: values of the recording's ``{placeholders}`` (``model_name``, ``pid``,
        ...). Families in ``own`` start empty: their label sets are this server's own
        (per-endpoint HTTP counters); the others start with the label sets a ready real
        server shows (its warm-up request created them), gauges at their recorded value."""
        self.families: dict[str, Family] = {f.name: f for f in rec.families}
        self.fill = dict(fill)
        self.series: dict[str, dict[Labels, float | Histogram]] = {n: {} for n in self.families}
        for fam in rec.families:
            if fam.name in own:
                continue
            for i, labels in enumerate(fam.ready):
                value = fam.values[i] if i < len(fam.values) else 0.0
                self._get(fam, self._labels(labels), value)

    def _labels(self, labels: Mapping[str, str]) -> Labels:
        out = {k: v.format_map(self.fill) if v.startswith("{") else v for k, v in labels.items()}
        return tuple(sorted(out.items()))

    def _template(self, fam: Family, given: Mapping[str, str]) -> Labels | None:
        templates = fam.ready or fam.seen
        if not templates:
            return None
        labels = dict(self._labels(templates[0]))
        labels.update({k: v for k, v in given.items() if k in fam.labels})
        return tuple(sorted(labels.items()))

    def _get(self, fam: Family, labels: Labels, start: float = 0.0) -> float | Histogram:
        series = self.series[fam.name]
        if labels not in series:
            if fam.type == "histogram":
                series[labels] = Histogram(tuple(_bound(b) for b in fam.buckets))
            else:
                series[labels] = start
        return series[labels]

    def _find(self, name: str, labels: Mapping[str, str]) -> tuple[Family, Labels] | None:
        fam = self.families.get(name)
        if fam is None:
            return None
        found = self._template(fam, labels)
        return None if found is None else (fam, found)

    def has(self, name: str) -> bool:
        return name in self.families

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """A counter (or gauge) up by ``amount``; creates the series, as SGLang's ``inc``."""
        found = self._find(name, labels)
        if found is not None:
            fam, key = found
            self.series[name][key] = float(self._get(fam, key)) + amount  # type: ignore[arg-type]

    def set(self, name: str, value: float, **labels: str) -> None:
        found = self._find(name, labels)
        if found is not None:
            self.series[name][found[1]] = float(value)

    def observe(self, name: str, value: float, times: float = 1.0, **labels: str) -> None:
        """A histogram observation (``times`` alike ones at once), its sum up by ``value``."""
        found = self._find(name, labels)
        if found is not None:
            hist = self._get(*found)
            assert isinstance(hist, Histogram)
            hist.observe(value, times)
            hist.total += value * times

    def observe_spread(self, name: str, interval: float, tokens: int, **labels: str) -> None:
        """SGLang's inter-token latency: ``tokens`` new tokens after ``interval`` seconds add
        ``interval`` to the sum and ``tokens`` to the bucket of ``interval / tokens``."""
        found = self._find(name, labels)
        if found is not None and tokens > 0:
            hist = self._get(*found)
            assert isinstance(hist, Histogram)
            hist.observe(interval / tokens, tokens)
            hist.total += interval

    def render(self, skip: Collection[str] = ()) -> str:
        """The exposition text: every family with a sample, in the recording's order."""
        lines: list[str] = []
        for name, fam in self.families.items():
            series = self.series[name]
            if not series or name in skip:
                continue
            doc = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} {fam.type}"]
            for labels, value in series.items():
                if isinstance(value, Histogram):
                    lines += _histogram_lines(name, fam, labels, value)
                else:
                    lines.append(f"{name}{_text_labels(labels)} {number(value)}")
        return "\n".join(lines) + "\n"


def _histogram_lines(name: str, fam: Family, labels: Labels, hist: Histogram) -> list[str]:
    out, running = [], 0.0
    for le, count in zip(fam.buckets, hist.counts, strict=True):
        running += count
        le_label = f'le="{le}"'
        out.append(f"{name}_bucket{_text_labels(labels, le_label)} {number(running)}")
    out.append(f"{name}_sum{_text_labels(labels)} {number(hist.total)}")
    out.append(f"{name}_count{_text_labels(labels)} {number(running)}")
    return out
