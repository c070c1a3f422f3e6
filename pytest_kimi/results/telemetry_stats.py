"""GPU telemetry as data: the lines of ``<layout>/telemetry.jsonl``, reading them back, and the
per-layout figures the comparison shows. Pure (no threads, no I/O but reading one file), so
every figure is checked by unit tests with hand-made samples.

The file, one JSON object a line, in the order written:

- ``{"start": {"clock": ..., "time_scale": ..., "interval_s": ..., "nodes": [...]}}``: when
  sampling began, on the client's ``time.perf_counter`` clock (the records' clock), so the
  samples line up with the requests;
- one line per GPU per sampling round: ``t`` (cluster seconds since sampling began: wall
  seconds x time scale, as the records are read), ``node``, ``gpu``, ``util_pct``,
  ``mem_used_mib``, ``mem_total_mib``, ``power_w``, ``sm_clock_mhz`` (null where
  ``nvidia-smi`` says ``[N/A]``);
- ``{"t": ..., "node": ..., "error": ...}`` the first time a node's query fails;
- ``{"measured": {"from": ..., "to": ...}}`` at the end: the measured requests' span in ``t``
  (first send to last end). Samples before ``from`` were taken during the warm-up.

Definitions (stated in docs/telemetry.md too): a *round* is one query of every node; the
deployment's utilisation in a round is the mean over every GPU sampled in it, its power the
sum over them. Only rounds inside the measured span count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_FIELDS = ("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "sm_clock_mhz")


@dataclass(frozen=True)
class GpuSample:
    """One GPU in one sampling round."""

    t: float  # cluster seconds since sampling began
    node: str
    gpu: int
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=False)


@dataclass
class TelemetrySeries:
    """What one layout's ``telemetry.jsonl`` holds."""

    origin_clock: float  # perf_counter when sampling began (t = 0)
    time_scale: float
    interval_s: float  # wall seconds between rounds
    nodes: tuple[str, ...]
    samples: list[GpuSample] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # node -> its first failure
    measured: tuple[float, float] | None = None  # the measured requests' span, in t

    def to_t(self, clock: float) -> float:
        """A perf_counter reading (a record's time) in this series' ``t``."""
        return (clock - self.origin_clock) * self.time_scale


def start_line(origin_clock: float, time_scale: float, interval_s: float, nodes: Sequence[str]):
    return json.dumps({"start": {"clock": origin_clock, "time_scale": time_scale,
                                 "interval_s": interval_s, "nodes": list(nodes)}})  # fmt: skip


def error_line(t: float, node: str, error: str) -> str:
    return json.dumps({"t": t, "node": node, "error": error})


def measured_line(start: float, end: float) -> str:
    return json.dumps({"measured": {"from": start, "to": end}})


def read_telemetry(path: Path) -> TelemetrySeries:
    """Read a ``telemetry.jsonl``; a line cut short by a killed run is skipped."""
    series: TelemetrySeries | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # the last line of a run killed mid-write
        if "start" in line:
            s = line["start"]
            series = TelemetrySeries(float(s["clock"]), float(s["time_scale"]),
                                     float(s["interval_s"]), tuple(s["nodes"]))  # fmt: skip
        elif series is None:
            raise ValueError(f"{path}: no start line before the samples")
        elif "measured" in line:
            series.measured = (float(line["measured"]["from"]), float(line["measured"]["to"]))
        elif "error" in line:
            series.errors.setdefault(line["node"], line["error"])
        elif "gpu" in line:
            series.samples.append(GpuSample(**line))
    if series is None:
        raise ValueError(f"{path}: empty telemetry file")
    return series


# -- rounds and figures ------------------------------------------------------------------
@dataclass(frozen=True)
class Round:
    """Every GPU sampled at one ``t``."""

    t: float
    samples: tuple[GpuSample, ...]

    def nodes(self) -> set[str]:
        return {s.node for s in self.samples}

    def util_mean(self) -> float | None:
        known = [s.util_pct for s in self.samples if s.util_pct is not None]
        return float(np.mean(known)) if known else None

    def power_total(self, nodes: Iterable[str]) -> float | None:
        """Total W over every GPU, or None unless every node answered with every power."""
        if not set(nodes) <= self.nodes() or any(s.power_w is None for s in self.samples):
            return None
        return float(sum(s.power_w for s in self.samples))  # type: ignore[misc]


def rounds(samples: Iterable[GpuSample]) -> list[Round]:
    by_t: dict[float, list[GpuSample]] = {}
    for s in samples:
        by_t.setdefault(s.t, []).append(s)
    return [Round(t, tuple(by_t[t])) for t in sorted(by_t)]


def integrate(times: Sequence[float], values: Sequence[float], start: float, end: float) -> float:
    """The integral over [start, end] of the line through (times, values): linear between
    samples, held flat before the first and after the last (uneven intervals are fine)."""
    if not times or end <= start:
        return 0.0
    xs = np.asarray(times, dtype=float)
    inner = xs[(xs > start) & (xs < end)]
    grid = np.concatenate(([start], inner, [end]))
    ys = np.interp(grid, xs, np.asarray(values, dtype=float))
    return float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(grid)))


@dataclass(frozen=True)
class TelemetrySummary:
    """One layout's GPU figures over its measured span (None: not known)."""

    gpu_util_mean: float | None  # % over every GPU sample in the span
    gpu_util_peak: float | None  # % the busiest round's mean over all GPUs
    power_mean_w: float | None  # W summed over every GPU of the deployment, mean over rounds
    power_peak_w: float | None  # the same sum, its largest round
    energy_j: float | None  # that sum integrated over the span (cluster seconds)
    energy_per_output_token_j: float | None  # energy_j / output tokens of successful requests
    rounds: int = 0  # sampling rounds inside the span
    gpus: int = 0  # distinct GPUs seen

    def figure(self, name: str) -> float | None:
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TelemetrySummary:
        return cls(**data)


def measured_span(records: Iterable[Any], series: TelemetrySeries) -> tuple[float, float] | None:
    """First send to last end of the measured (not warm-up) requests, in the series' ``t``."""
    measured = [r for r in records if not r.warmup]
    ends = [r.end_time for r in measured if r.end_time is not None]
    if not measured or not ends:
        return None
    return series.to_t(min(r.latency_start for r in measured)), series.to_t(max(ends))


def summarize_telemetry(
    series: TelemetrySeries, span: tuple[float, float], output_tokens: int
) -> TelemetrySummary:
    """The layout's figures over ``span``. Energy needs the total power known in every round
    inside the span and in the rounds just around it (its edges are interpolated)."""
    start, end = span
    every = rounds(series.samples)
    inside = [r for r in every if start <= r.t <= end]
    utils = [s.util_pct for r in inside for s in r.samples if s.util_pct is not None]
    peaks = [u for r in inside if (u := r.util_mean()) is not None]
    powers = [p for r in inside if (p := r.power_total(series.nodes)) is not None]
    before = [r for r in every if r.t < start][-1:]
    after = [r for r in every if r.t > end][:1]
    used = before + inside + after
    totals = [r.power_total(series.nodes) for r in used]
    energy = None
    if used and all(p is not None for p in totals):
        energy = integrate([r.t for r in used], totals, start, end)  # type: ignore[arg-type]
    return TelemetrySummary(
        gpu_util_mean=float(np.mean(utils)) if utils else None,
        gpu_util_peak=max(peaks) if peaks else None,
        power_mean_w=float(np.mean(powers)) if powers else None,
        power_peak_w=max(powers) if powers else None,
        energy_j=energy,
        energy_per_output_token_j=energy / output_tokens if energy is not None
        and output_tokens > 0 else None,
        rounds=len(inside),
        gpus=len({(s.node, s.gpu) for r in inside for s in r.samples}),
    )  # fmt: skip


@dataclass(frozen=True)
class NodeCurve:
    """One node's plot: per round, its GPUs' mean, min and max utilisation and total power."""

    t: list[float]
    util_mean: list[float]
    util_min: list[float]
    util_max: list[float]
    power_w: list[float]  # NaN where a GPU gave none


def node_curves(series: TelemetrySeries, shift: float = 0.0) -> dict[str, NodeCurve]:
    """Per node, in the order sampled; ``t - shift`` on the x axis (shift: where the plot's
    zero is in the series' ``t``, e.g. the first measured request)."""
    out: dict[str, NodeCurve] = {}
    for node in series.nodes:
        curve = NodeCurve([], [], [], [], [])
        for r in rounds(s for s in series.samples if s.node == node):
            utils = [s.util_pct for s in r.samples if s.util_pct is not None]
            watts = [s.power_w for s in r.samples]
            curve.t.append(r.t - shift)
            curve.util_mean.append(float(np.mean(utils)) if utils else math.nan)
            curve.util_min.append(min(utils) if utils else math.nan)
            curve.util_max.append(max(utils) if utils else math.nan)
            known = None not in watts
            curve.power_w.append(float(sum(watts)) if known else math.nan)  # type: ignore[arg-type]
        out[node] = curve
    return out
