"""One run's statistics as a typed value, and its exact round trip through ``summary.json``.

Keys on disk are ``sglang.bench_serving --output-file``'s (``p95_ttft_ms``) plus ours; names in
code and everywhere a user reads a figure are the catalogue's (``ttft_p95``). :meth:`Summary.
from_dict` reads back exactly what :meth:`Summary.to_dict` wrote (JSON floats round-trip), so a
report rendered from saved files equals the live one without recomputing anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_kimi.results import catalogue

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
_NAN = float("nan")
# Summary attribute per latency prefix
_ATTRS: dict[str, str] = {
    "ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2e_ms", "ttfat": "ttfat_ms",
    **{prefix: f"{prefix}_ms" for prefix in catalogue.SCHEDULE_PREFIXES},
}  # fmt: skip
_LATER: frozenset[str] = frozenset(  # absent from summary.json of older runs
    {"ttfat_ms", *(f"{prefix}_ms" for prefix in catalogue.SCHEDULE_PREFIXES)}
)


def percentile_key(q: float) -> str:
    """Name a percentile the way reports do: 95.0 -> "p95", 99.9 -> "p99.9"."""
    return "p" + np.format_float_positional(float(q), trim="-")


def normalize_percentiles(percentiles: Sequence[float]) -> tuple[float, ...]:
    """Sorted, unique, validated: a typo like 950 should fail here, not as a numpy error."""
    out: set[float] = set()
    for q in percentiles:
        value = float(q)
        if not (0.0 <= value <= 100.0):
            raise ValueError(f"percentile {q!r} is outside [0, 100]")
        out.add(value)
    return tuple(sorted(out))


def json_safe(value: Any) -> Any:
    """NaN/inf -> None and numpy scalars -> Python, so ``json.dumps`` emits valid JSON."""
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _number(value: Any) -> float:
    return _NAN if value is None else float(value)


@dataclass(frozen=True)
class Distribution:
    """Summary statistics of one latency sample; every value is NaN when ``count`` is 0."""

    count: int
    mean: float
    median: float
    std: float
    min: float
    max: float
    percentiles: dict[float, float]

    def percentile(self, q: float) -> float:
        """Look up a computed percentile; asking for one never computed is a caller bug."""
        key = float(q)
        if key not in self.percentiles:
            computed = ", ".join(percentile_key(p) for p in self.percentiles) or "none"
            raise KeyError(
                f"percentile {q!r} was not computed (computed: {computed}); "
                "pass it in `percentiles=`"
            )
        return self.percentiles[key]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view: percentiles as "p95", "p99.9"; NaN becomes None."""
        out: dict[str, Any] = {
            "count": self.count,
            "mean": self.mean,
            "median": self.median,
            "std": self.std,
            "min": self.min,
            "max": self.max,
        }
        for q, value in self.percentiles.items():
            out[percentile_key(q)] = value
        return json_safe(out)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Distribution:
        """The inverse of :meth:`to_dict` (None back to NaN)."""
        pct = {float(k[1:]): _number(v) for k, v in data.items() if k.startswith("p")}
        return cls(
            count=int(data["count"]),
            mean=_number(data["mean"]),
            median=_number(data["median"]),
            std=_number(data["std"]),
            min=_number(data["min"]),
            max=_number(data["max"]),
            percentiles=pct,
        )


def distribution(
    values: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> Distribution:
    """Describe a sample as bench_serving does: population std, numpy linear percentiles."""
    qs = normalize_percentiles(percentiles)
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        return Distribution(0, _NAN, _NAN, _NAN, _NAN, _NAN, {q: _NAN for q in qs})
    if not np.all(np.isfinite(arr)):
        raise ValueError("distribution() needs finite values (got NaN or inf)")
    pct = np.percentile(arr, qs) if qs else np.empty(0)
    return Distribution(
        count=int(arr.size),
        mean=float(np.mean(arr)),
        median=float(np.median(arr)),
        std=float(np.std(arr)),
        min=float(np.min(arr)),
        max=float(np.max(arr)),
        percentiles={q: float(v) for q, v in zip(qs, pct, strict=True)},
    )


@dataclass(frozen=True)
class Summary:
    """One run's numbers, named and serialized like ``bench_serving --output-file``."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution
    peak_concurrency: int
    peak_concurrency_bucketed: int
    time_scale: float
    percentiles: tuple[float, ...]
    goodput: float = _NAN  # req/s meeting every per-request limit; NaN when none configured
    goodput_limits_ms: tuple[tuple[str, float], ...] = ()
    # reasoning models: time to the first answer token, and how many output tokens were thinking
    ttfat_ms: Distribution = Distribution(0, _NAN, _NAN, _NAN, _NAN, _NAN, {})
    # open-loop runs (a request rate, a trace): how late requests left against their
    # schedule, and TTFT / E2E from the schedule's instant; empty (count 0) in a closed loop
    dispatch_delay_ms: Distribution = Distribution(0, _NAN, _NAN, _NAN, _NAN, _NAN, {})
    ttft_from_schedule_ms: Distribution = Distribution(0, _NAN, _NAN, _NAN, _NAN, _NAN, {})
    e2e_from_schedule_ms: Distribution = Distribution(0, _NAN, _NAN, _NAN, _NAN, _NAN, {})
    total_reasoning_tokens: int = 0
    # speculative decoding: completion tokens per verify step; NaN where nothing speculated.
    # Source: "meta_info" (each request's spec_verify_ct) or "server" (the replicas'
    # sglang:spec_accept_length gauge, where responses carry no counts: the OpenAI APIs)
    spec_accept_length: float = _NAN
    spec_accept_length_source: str | None = None
    # prompt tokens the servers found in their prefix caches (records' cached_tokens), and
    # their share of those requests' prompt tokens; None / NaN where no server said
    cached_tokens_total: int | None = None
    cache_hit_rate: float = _NAN
    # the same figures over each SPEED-Bench category's requests (empty: one category or none)
    by_category: Mapping[str, Summary] = field(default_factory=dict)
    # ... and over each turn of multi-turn sessions, by the records' 0-based turn index
    by_turn: Mapping[str, Summary] = field(default_factory=dict)

    @property
    def total_answer_tokens(self) -> int:
        """Output tokens that were not reasoning."""
        return self.total_output_tokens - self.total_reasoning_tokens

    @property
    def total(self) -> int:
        """Every measured request: failures count, they never vanish."""
        return self.completed + self.failed

    @property
    def success_rate(self) -> float:
        """Completed / total; NaN when nothing ran (0 % would claim failures that never were)."""
        return self.completed / self.total if self.total else _NAN

    def _aggregate(self, name: str) -> float:
        attr = "duration_s" if name == "duration" else name
        return float(getattr(self, attr))

    @property
    def open_loop(self) -> bool:
        """Whether its requests kept a schedule (a request rate, a trace): it has dispatch
        delays and latencies from the schedule."""
        return self.dispatch_delay_ms.count > 0

    def distributions(self) -> dict[str, Distribution]:
        """Per latency prefix (ttft, tpot, itl, e2e, ttfat, and the schedule's)."""
        return {prefix: getattr(self, attr) for prefix, attr in _ATTRS.items()}

    def _written(self) -> dict[str, Distribution]:
        """What ``summary.json`` keeps: every distribution, the schedule's only in an open
        loop (a closed loop's file reads as it did before they existed)."""
        dists = self.distributions()
        if self.open_loop:
            return dists
        return {p: d for p, d in dists.items() if p not in catalogue.SCHEDULE_PREFIXES}

    def metric_names(self) -> list[str]:
        """Every name :meth:`metric` accepts, so SLO specs can be validated up front."""
        names = list(catalogue.AGGREGATES)
        for prefix, dist in self.distributions().items():
            names += [f"{prefix}_{stat}" for stat in catalogue.STATS]
            names += [f"{prefix}_{percentile_key(q)}" for q in dist.percentiles]
        return names

    def metric(self, name: str) -> float:
        """One number by its catalogue name (``ttft_p95``, ``output_throughput``)."""
        if name in catalogue.AGGREGATES:
            return self._aggregate(name)
        try:
            m = catalogue.metric(name)
        except catalogue.UnknownMetric:
            m = None
        if m is not None:
            dist = self.distributions()[m.prefix]
            if m.percentile is None:
                return float(getattr(dist, m.stat))
            if m.percentile in dist.percentiles:
                return dist.percentiles[m.percentile]
        raise KeyError(f"unknown metric {name!r}; valid names: {', '.join(self.metric_names())}")

    def figures(self) -> dict[str, float]:
        """Every finite figure by catalogue name: what JUnit properties and pytest-benchmark's
        ``extra_info`` carry, so a figure has one name wherever a user reads it."""
        out: dict[str, float] = {}
        for name in self.metric_names():
            value = self.metric(name)
            if math.isfinite(value):
                counted = name in catalogue.AGGREGATES and catalogue.metric(name).unit == "count"
                out[name] = int(value) if counted else value
        return out

    def to_dict(self) -> dict[str, Any]:
        """bench_serving's output-file keys plus ours; JSON-ready (NaN -> None)."""
        out: dict[str, Any] = {
            name: self._aggregate(name)
            for name in (
                "completed", "failed", "success_rate", "duration", "total_input_tokens",
                "total_output_tokens", "request_throughput", "input_throughput",
                "output_throughput", "total_throughput",
            )
        }  # fmt: skip
        out["completed"], out["failed"] = self.completed, self.failed
        out["total_input_tokens"] = self.total_input_tokens
        out["total_output_tokens"] = self.total_output_tokens
        out["total_reasoning_tokens"] = self.total_reasoning_tokens
        out["total_answer_tokens"] = self.total_answer_tokens
        dists = self._written()
        for prefix, dist in dists.items():
            infix = catalogue.LATENCY_PREFIXES[prefix][1]
            out[f"mean_{infix}_ms"] = dist.mean
            out[f"median_{infix}_ms"] = dist.median
            out[f"std_{infix}_ms"] = dist.std
            for q, value in dist.percentiles.items():
                out[f"{percentile_key(q)}_{infix}_ms"] = value
            if prefix in catalogue.SCHEDULE_PREFIXES:
                out[f"max_{infix}_ms"] = dist.max
        out["time_scale"] = self.time_scale
        out["peak_concurrency_exact"] = self.peak_concurrency
        out["max_concurrent_requests_bucketed"] = self.peak_concurrency_bucketed
        out["percentiles"] = list(self.percentiles)
        out["goodput"] = self.goodput
        out["goodput_limits_ms"] = dict(self.goodput_limits_ms)
        out["distributions"] = {_ATTRS[prefix]: dist.to_dict() for prefix, dist in dists.items()}
        out["spec_accept_length"] = self.spec_accept_length
        out["spec_accept_length_source"] = self.spec_accept_length_source
        out["cached_tokens_total"] = self.cached_tokens_total
        out["cache_hit_rate"] = self.cache_hit_rate
        out["by_category"] = {name: sub.to_dict() for name, sub in self.by_category.items()}
        out["by_turn"] = {turn: sub.to_dict() for turn, sub in self.by_turn.items()}
        return json_safe(out)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """The inverse of :meth:`to_dict`: the stored figures, nothing recomputed. A file from
        before TTFAT and the reasoning split existed reads with those unmeasured (NaN, 0)."""
        stored = data["distributions"]
        dists = {
            attr: Distribution.from_dict(stored[attr])
            for attr in _ATTRS.values()
            if attr in stored or attr not in _LATER
        }
        for attr in _LATER - dists.keys():  # unmeasured, with the run's percentiles
            dists[attr] = distribution([], list(dists["ttft_ms"].percentiles))
        return cls(
            completed=int(data["completed"]),
            failed=int(data["failed"]),
            duration_s=_number(data["duration"]),
            total_input_tokens=int(data["total_input_tokens"]),
            total_output_tokens=int(data["total_output_tokens"]),
            request_throughput=_number(data["request_throughput"]),
            input_throughput=_number(data["input_throughput"]),
            output_throughput=_number(data["output_throughput"]),
            total_throughput=_number(data["total_throughput"]),
            **dists,
            peak_concurrency=int(data["peak_concurrency_exact"]),
            peak_concurrency_bucketed=int(data["max_concurrent_requests_bucketed"]),
            time_scale=float(data["time_scale"]),
            percentiles=tuple(float(q) for q in data["percentiles"]),
            goodput=_number(data.get("goodput")),
            goodput_limits_ms=tuple(sorted(data.get("goodput_limits_ms", {}).items())),
            total_reasoning_tokens=int(data.get("total_reasoning_tokens") or 0),
            spec_accept_length=_number(data.get("spec_accept_length")),
            spec_accept_length_source=data.get("spec_accept_length_source"),
            cached_tokens_total=data.get("cached_tokens_total"),
            cache_hit_rate=_number(data.get("cache_hit_rate")),
            by_category={
                name: cls.from_dict(sub) for name, sub in (data.get("by_category") or {}).items()
            },
            by_turn={turn: cls.from_dict(sub) for turn, sub in (data.get("by_turn") or {}).items()},
        )
