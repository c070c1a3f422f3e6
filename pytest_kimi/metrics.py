"""Records -> summary statistics, with the definitions of ``sglang.bench_serving``.

Pure functions, no I/O. Record times are wall seconds on the client's clock; every time
difference is multiplied by ``time_scale`` to get cluster time (1 on a real cluster; 40 when
the mock runs 40x faster than the cluster it models). Latencies are reported in milliseconds,
durations in seconds, throughputs per cluster second.

Where ``bench_serving`` is misleading we keep its number (so results compare with peers) and
add a correct one next to it, labelled: peak concurrency is reported both bucketed (its way)
and exact (a sweep over half-open intervals).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from pytest_kimi.workload.records import RequestRecord

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)

# bench_serving's output file always carries p99_*; we always compute it so those keys exist.
_BENCH_SERVING_PERCENTILE = 99.0

_NAN = float("nan")
_SCALAR_STATS: tuple[str, ...] = ("mean", "median", "std", "min", "max")
_PERCENTILE_STAT = re.compile(r"p(\d+(?:\.\d+)?)")
# metric() prefix -> Summary attribute; bench_serving's key infix for to_dict().
_LATENCIES: tuple[tuple[str, str, str], ...] = (
    ("ttft", "ttft_ms", "ttft"),
    ("tpot", "tpot_ms", "tpot"),
    ("itl", "itl_ms", "itl"),
    ("e2e", "e2e_ms", "e2e_latency"),
)
GOODPUT_KEYS: tuple[str, ...] = ("ttft", "tpot", "e2e")


def percentile_key(q: float) -> str:
    """Name a percentile the way reports do: 95.0 -> "p95", 99.9 -> "p99.9"."""
    return "p" + np.format_float_positional(float(q), trim="-")


def _normalize_percentiles(percentiles: Sequence[float]) -> tuple[float, ...]:
    """Sorted, unique, validated: a typo like 950 should fail here, not as a numpy error."""
    out: set[float] = set()
    for q in percentiles:
        value = float(q)
        if not (0.0 <= value <= 100.0):
            raise ValueError(f"percentile {q!r} is outside [0, 100]")
        out.add(value)
    return tuple(sorted(out))


def _json_safe(value: Any) -> Any:
    """NaN/inf -> None and numpy scalars -> Python, so ``json.dumps`` emits valid JSON."""
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
        return _json_safe(out)


def distribution(
    values: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> Distribution:
    """Describe a sample as bench_serving does: population std, numpy linear percentiles."""
    qs = _normalize_percentiles(percentiles)
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

    @property
    def total(self) -> int:
        """Every measured request: failures count, they never vanish."""
        return self.completed + self.failed

    @property
    def success_rate(self) -> float:
        """Completed / total; NaN when nothing ran (0 % would claim failures that never were)."""
        return self.completed / self.total if self.total else _NAN

    def _scalars(self) -> dict[str, float]:
        return {
            "request_throughput": self.request_throughput,
            "input_throughput": self.input_throughput,
            "output_throughput": self.output_throughput,
            "total_throughput": self.total_throughput,
            "duration": self.duration_s,
            "success_rate": self.success_rate,
            "completed": float(self.completed),
            "failed": float(self.failed),
            "peak_concurrency": float(self.peak_concurrency),
            "peak_concurrency_bucketed": float(self.peak_concurrency_bucketed),
            "total_input_tokens": float(self.total_input_tokens),
            "total_output_tokens": float(self.total_output_tokens),
            "goodput": self.goodput,
        }

    def _distributions(self) -> dict[str, Distribution]:
        return {prefix: getattr(self, attr) for prefix, attr, _ in _LATENCIES}

    def metric_names(self) -> list[str]:
        """Every name :meth:`metric` accepts, so SLO specs can be validated up front."""
        names = list(self._scalars())
        for prefix, dist in self._distributions().items():
            names += [f"{prefix}_{stat}" for stat in _SCALAR_STATS]
            names += [f"{prefix}_{percentile_key(q)}" for q in dist.percentiles]
        return names

    def metric(self, name: str) -> float:
        """One number by name (e.g. "ttft_p95", "output_throughput"), for SLO checks."""
        scalars = self._scalars()
        if name in scalars:
            return scalars[name]
        prefix, _, stat = name.partition("_")
        dist = self._distributions().get(prefix)
        if dist is not None:
            if stat in _SCALAR_STATS:
                return float(getattr(dist, stat))
            match = _PERCENTILE_STAT.fullmatch(stat)
            if match is not None and float(match.group(1)) in dist.percentiles:
                return dist.percentiles[float(match.group(1))]
        raise KeyError(f"unknown metric {name!r}; valid names: {', '.join(self.metric_names())}")

    def to_dict(self) -> dict[str, Any]:
        """bench_serving's output-file keys plus ours; JSON-ready (NaN -> None)."""
        out: dict[str, Any] = {
            "completed": self.completed,
            "failed": self.failed,
            "success_rate": self.success_rate,
            "duration": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "input_throughput": self.input_throughput,
            "output_throughput": self.output_throughput,
            "total_throughput": self.total_throughput,
        }
        for _, attr, infix in _LATENCIES:
            dist: Distribution = getattr(self, attr)
            out[f"mean_{infix}_ms"] = dist.mean
            out[f"median_{infix}_ms"] = dist.median
            out[f"std_{infix}_ms"] = dist.std
            for q, value in dist.percentiles.items():
                out[f"{percentile_key(q)}_{infix}_ms"] = value
        out["time_scale"] = self.time_scale
        out["peak_concurrency_exact"] = self.peak_concurrency
        out["max_concurrent_requests_bucketed"] = self.peak_concurrency_bucketed
        out["percentiles"] = list(self.percentiles)
        out["goodput"] = self.goodput
        out["goodput_limits_ms"] = dict(self.goodput_limits_ms)
        out["distributions"] = {attr: getattr(self, attr).to_dict() for _, attr, _ in _LATENCIES}
        return _json_safe(out)


# ----------------------------------------------------------------------------- helpers


def _check_time_scale(time_scale: float) -> float:
    """A zero or negative scale would silently flip or erase every latency."""
    scale = float(time_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"time_scale must be a positive finite number, got {time_scale!r}")
    return scale


def _measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Warmup requests exist to fill caches, not to be measured."""
    return [r for r in records if not r.warmup]


def _duration_s(records: Sequence[RequestRecord], time_scale: float) -> float:
    """First send -> last end over all measured requests (failures included), cluster seconds."""
    ends = [r.end_time for r in records if r.end_time is not None]
    if not records or not ends:
        return 0.0
    start = min(r.send_time for r in records)
    return max(0.0, (max(ends) - start) * time_scale)


def _rate(amount: float, duration_s: float) -> float:
    """Per-second rate; NaN when nothing elapsed (infinite would be a lie, 0 too)."""
    return amount / duration_s if duration_s > 0 else _NAN


@dataclass(frozen=True)
class _Latencies:
    """One successful request's own latencies in cluster ms; None when not measurable."""

    ttft: float | None
    tpot: float | None
    e2e: float | None


def _request_latencies(record: RequestRecord, time_scale: float) -> _Latencies:
    ms = time_scale * 1000.0
    ttft = None
    if record.first_token_time is not None:
        ttft = (record.first_token_time - record.send_time) * ms
    e2e = None if record.end_time is None else (record.end_time - record.send_time) * ms
    tpot = None
    n_out = record.output_tokens
    if ttft is not None and e2e is not None and n_out > 1:
        tpot = (e2e - ttft) / (n_out - 1)
    return _Latencies(ttft=ttft, tpot=tpot, e2e=e2e)


def _inter_token_latencies(record: RequestRecord, time_scale: float) -> list[float]:
    """Gaps between content chunks, split evenly over the tokens a chunk carries.

    A chunk with k tokens stands for k tokens that arrived together, so it contributes k
    values of gap/k (bench_serving does this for SGLang's cumulative ``completion_tokens``).
    The first chunk contributes nothing: its delay is TTFT. A chunk reporting 0 tokens
    still carried text, so it counts as one.
    """
    ms = time_scale * 1000.0
    out: list[float] = []
    for prev, cur in pairwise(record.chunks):
        k = max(cur.tokens, 1)
        out.extend([(cur.time - prev.time) * ms / k] * k)
    return out


def _exact_peak(records: Sequence[RequestRecord], start: float, time_scale: float) -> int:
    """Most requests in flight at once: sweep over half-open [send, end) intervals.

    An end at t and a start at t do not overlap (ends are processed first). Failed requests
    count: they held a slot. Requests without an end time, or with an empty interval, do not.
    """
    events: list[tuple[float, int]] = []
    for r in records:
        if r.end_time is None:
            continue
        s = (r.send_time - start) * time_scale
        e = (r.end_time - start) * time_scale
        if e > s:
            events += [(s, 1), (e, -1)]
    events.sort()
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def _bucketed_peak(records: Sequence[RequestRecord], start: float, time_scale: float) -> int:
    """bench_serving's "Peak concurrent requests": max successful requests per 1-s bucket.

    Each request counts in every bucket from int(send) to int(end) inclusive (cluster seconds
    since the first send). This overcounts: two back-to-back requests [0, 1) and [1, 2) both
    land in bucket 1 and look concurrent. Kept for comparison with peers; see ``_exact_peak``.
    """
    diff: dict[int, int] = {}
    for r in records:
        if not r.success or r.end_time is None:
            continue
        first = int((r.send_time - start) * time_scale)
        last = int((r.end_time - start) * time_scale)
        if last < first:
            continue
        diff[first] = diff.get(first, 0) + 1
        diff[last + 1] = diff.get(last + 1, 0) - 1
    current = peak = 0
    for bucket in sorted(diff):
        current += diff[bucket]
        peak = max(peak, current)
    return peak


# ----------------------------------------------------------------------------- public API


def summarize(
    records: Sequence[RequestRecord],
    *,
    time_scale: float = 1.0,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_limits_ms: Mapping[str, float] | None = None,
) -> Summary:
    """All of a run's statistics from its per-request records.

    ``goodput_limits_ms`` (keys "ttft", "tpot", "e2e") adds :func:`goodput` to the summary.

    Only successful requests feed latencies and token totals; failures are counted and
    included in the duration and exact peak. A successful request without a first-token
    time adds no TTFT/TPOT. p99 is always computed (bench_serving's output always has it).
    """
    scale = _check_time_scale(time_scale)
    configured = _normalize_percentiles(percentiles)
    stat_percentiles = _normalize_percentiles((*configured, _BENCH_SERVING_PERCENTILE))
    measured = _measured(records)
    ok = [r for r in measured if r.success]

    ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    itls: list[float] = []
    for r in ok:
        lat = _request_latencies(r, scale)
        if lat.ttft is not None:
            ttfts.append(lat.ttft)
        if lat.tpot is not None:
            tpots.append(lat.tpot)
        if lat.e2e is not None:
            e2es.append(lat.e2e)
        itls += _inter_token_latencies(r, scale)

    duration = _duration_s(measured, scale)
    start = min((r.send_time for r in measured), default=0.0)
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    return Summary(
        completed=len(ok),
        failed=len(measured) - len(ok),
        duration_s=duration,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=_rate(len(ok), duration),
        input_throughput=_rate(total_in, duration),
        output_throughput=_rate(total_out, duration),
        total_throughput=_rate(total_in + total_out, duration),
        ttft_ms=distribution(ttfts, stat_percentiles),
        tpot_ms=distribution(tpots, stat_percentiles),
        itl_ms=distribution(itls, stat_percentiles),
        e2e_ms=distribution(e2es, stat_percentiles),
        peak_concurrency=_exact_peak(measured, start, scale),
        peak_concurrency_bucketed=_bucketed_peak(measured, start, scale),
        time_scale=scale,
        percentiles=configured,
        goodput=goodput(records, goodput_limits_ms, time_scale=scale)
        if goodput_limits_ms
        else _NAN,
        goodput_limits_ms=tuple(sorted((goodput_limits_ms or {}).items())),
    )


def per_request_ms(
    records: Sequence[RequestRecord], *, time_scale: float = 1.0
) -> dict[str, list[float]]:
    """Each successful measured request's TTFT, TPOT and E2E in ms (for bootstrap intervals)."""
    scale = _check_time_scale(time_scale)
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "e2e": []}
    for record in _measured(records):
        if not record.success:
            continue
        lat = _request_latencies(record, scale)
        for key in out:
            value = getattr(lat, key)
            if value is not None:
                out[key].append(value)
    return out


def goodput(
    records: Sequence[RequestRecord],
    limits_ms: Mapping[str, float],
    *,
    time_scale: float = 1.0,
) -> float:
    """Requests per second that met every per-request SLO (vLLM ``--goodput`` semantics).

    ``limits_ms`` maps "ttft", "tpot", "e2e" to a limit in ms; a request meets a limit when its
    own value is <= the limit. A request with no TPOT (one output token) passes the TPOT limit;
    one whose TTFT or E2E was not measured fails that limit. The duration is summarize()'s.
    """
    unknown = sorted(set(limits_ms) - set(GOODPUT_KEYS))
    if unknown:
        raise ValueError(
            f"unknown goodput limit(s) {unknown}; valid keys: {', '.join(GOODPUT_KEYS)}"
        )
    scale = _check_time_scale(time_scale)
    measured = _measured(records)
    good = 0
    for r in measured:
        if not r.success:
            continue
        lat = _request_latencies(r, scale)
        if _meets(lat, limits_ms):
            good += 1
    return _rate(good, _duration_s(measured, scale))


def _meets(lat: _Latencies, limits_ms: Mapping[str, float]) -> bool:
    """Whether one request's latencies are within every given limit."""
    for key, limit in limits_ms.items():
        value = getattr(lat, key)
        if value is None:
            if key == "tpot":
                continue
            return False
        if value > limit:
            return False
    return True
