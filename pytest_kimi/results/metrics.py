"""Records -> summary statistics, with the definitions of ``sglang.bench_serving``.

Pure functions, no I/O. Record times are wall seconds on the client's clock; every time
difference is multiplied by ``time_scale`` to get cluster time (1 on a real cluster; 40 when
the mock runs 40x faster than the cluster it models). Latencies are reported in milliseconds,
durations in seconds, throughputs per cluster second. The result type, :class:`Summary`, and
its names live in :mod:`pytest_kimi.results.summary` and :mod:`pytest_kimi.results.catalogue`.

Where ``bench_serving`` is misleading we keep its number (so results compare with peers) and
add a correct one next to it, labelled: peak concurrency is reported both bucketed (its way)
and exact (a sweep over half-open intervals).

Reasoning models: TTFT, TPOT and ITL count every generated token, reasoning or answer (the
client records the first token of any kind), so they are the server's figures whether or not
it separates reasoning. TTFAT (time to first answer token) is what a user waits until the
answer starts; reasoning and answer token totals say how the output splits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pytest_kimi.results.catalogue import PER_REQUEST_PREFIXES
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.results.summary import (
    DEFAULT_PERCENTILES,
    Distribution,
    Summary,
    distribution,
    normalize_percentiles,
    percentile_key,
)

__all__ = [
    "DEFAULT_PERCENTILES",
    "GOODPUT_KEYS",
    "Distribution",
    "Summary",
    "distribution",
    "goodput",
    "per_request_ms",
    "percentile_key",
    "summarize",
]

# bench_serving's output file always carries p99_*; we always compute it so those keys exist.
_BENCH_SERVING_PERCENTILE = 99.0
_NAN = float("nan")
GOODPUT_KEYS: tuple[str, ...] = ("ttft", "tpot", "e2e")


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
    """First send -> last end over all measured requests (failures included), cluster seconds.
    Requests sent in batches (``--kimi-until-decided``) or runs (``--kimi-repeat``): the sum of
    each batch's or run's own span, so the pauses between them, where the harness judged, or
    flushed caches and brought a layout up, and nothing was served, are not in the throughputs."""
    parts = {(r.batch, r.repeat) for r in records}
    if len(parts) > 1:
        return sum(_duration_s([r for r in records if (r.batch, r.repeat) == part], time_scale)
                   for part in parts)  # fmt: skip
    ends = [r.end_time for r in records if r.end_time is not None]
    if not records or not ends:
        return 0.0
    start = min(r.latency_start for r in records)
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
    ttfat: float | None = None  # to the first answer token; None when no answer streamed
    # open-loop runs only (None in a closed loop): how late it left against its schedule,
    # and TTFT / E2E from the schedule's instant (= dispatch_delay + TTFT / E2E)
    dispatch_delay: float | None = None
    ttft_from_schedule: float | None = None
    e2e_from_schedule: float | None = None


def _since_start(record: RequestRecord, time: float | None, ms: float) -> float | None:
    return None if time is None else (time - record.latency_start) * ms


def _request_latencies(record: RequestRecord, time_scale: float) -> _Latencies:
    """TPOT over all output tokens after the first, reasoning included (bench_serving's
    ``(latency - ttft) / (output_len - 1)`` with the server's output token count)."""
    ms = time_scale * 1000.0
    ttft = _since_start(record, record.first_token_time, ms)
    e2e = _since_start(record, record.end_time, ms)
    tpot = None
    n_out = record.output_tokens
    if ttft is not None and e2e is not None and n_out > 1:
        tpot = (e2e - ttft) / (n_out - 1)
    ttfat = _since_start(record, record.first_answer_time, ms)
    late = record.dispatch_delay
    if late is None:
        return _Latencies(ttft=ttft, tpot=tpot, e2e=e2e, ttfat=ttfat)
    late *= ms
    return _Latencies(
        ttft=ttft, tpot=tpot, e2e=e2e, ttfat=ttfat, dispatch_delay=late,
        ttft_from_schedule=None if ttft is None else late + ttft,
        e2e_from_schedule=None if e2e is None else late + e2e,
    )  # fmt: skip


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
        s = (r.latency_start - start) * time_scale
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
        first = int((r.latency_start - start) * time_scale)
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
    server_accept_length: float | None = None,
) -> Summary:
    """All of a run's statistics from its per-request records, overall and (where the
    requests come from more than one SPEED-Bench category) per category.

    ``goodput_limits_ms`` (keys "ttft", "tpot", "e2e") adds :func:`goodput` to the summary.
    ``server_accept_length``: the replicas' ``sglang:spec_accept_length`` after the run, the
    accept length where no record carries speculative counts (:func:`spec_accept_length`).

    Only successful requests feed latencies and token totals; failures are counted and
    included in the duration and exact peak. A successful request without a first-token
    time adds no TTFT/TPOT. p99 is always computed (bench_serving's output always has it).
    """
    scale = _check_time_scale(time_scale)
    configured = normalize_percentiles(percentiles)
    stat_percentiles = normalize_percentiles((*configured, _BENCH_SERVING_PERCENTILE))
    measured = _measured(records)
    ok = [r for r in measured if r.success]

    samples: dict[str, list[float]] = {prefix: [] for prefix in PER_REQUEST_PREFIXES}
    itls: list[float] = []
    for r in ok:
        lat = _request_latencies(r, scale)
        for prefix, sample in samples.items():
            value = getattr(lat, prefix)
            if value is not None:
                sample.append(value)
        itls += _inter_token_latencies(r, scale)
    dists = {prefix: distribution(sample, stat_percentiles) for prefix, sample in samples.items()}

    duration = _duration_s(measured, scale)
    start = min((r.latency_start for r in measured), default=0.0)
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    total_reasoning = sum(r.reasoning_tokens for r in ok)
    options = {"time_scale": scale, "percentiles": configured,
               "goodput_limits_ms": goodput_limits_ms}  # fmt: skip
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
        ttft_ms=dists["ttft"],
        tpot_ms=dists["tpot"],
        itl_ms=distribution(itls, stat_percentiles),
        e2e_ms=dists["e2e"],
        peak_concurrency=_exact_peak(measured, start, scale),
        peak_concurrency_bucketed=_bucketed_peak(measured, start, scale),
        time_scale=scale,
        percentiles=configured,
        goodput=goodput(records, goodput_limits_ms, time_scale=scale)
        if goodput_limits_ms
        else _NAN,
        goodput_limits_ms=tuple(sorted((goodput_limits_ms or {}).items())),
        ttfat_ms=dists["ttfat"],
        dispatch_delay_ms=dists["dispatch_delay"],
        ttft_from_schedule_ms=dists["ttft_from_schedule"],
        e2e_from_schedule_ms=dists["e2e_from_schedule"],
        total_reasoning_tokens=total_reasoning,
        **_speculation(ok, server_accept_length),
        **_prefix_cache(ok),
        by_category=_by(measured, lambda r: r.category, **options),
        by_turn=_by(measured, lambda r: r.turn, **options),
    )


def spec_accept_length(records: Sequence[RequestRecord]) -> float:
    """Completion tokens per verify step over the requests that report their steps (SGLang's
    per-request ``spec_accept_length`` is the same ratio for one request): NaN when none
    does. Token-weighted, so long requests count as much as they decoded."""
    counted = [r for r in records if r.spec_verify_ct]
    steps = sum(r.spec_verify_ct or 0 for r in counted)
    return sum(r.output_tokens for r in counted) / steps if steps else _NAN


def _speculation(ok: Sequence[RequestRecord], server: float | None) -> dict:
    length = spec_accept_length(ok)
    if not math.isnan(length):
        return {"spec_accept_length": length, "spec_accept_length_source": "meta_info"}
    if server is not None and server > 0:  # the gauge is 0 on a server that does not speculate
        return {"spec_accept_length": server, "spec_accept_length_source": "server"}
    return {}


def _prefix_cache(ok: Sequence[RequestRecord]) -> dict:
    """Prompt tokens the servers found in their prefix caches, and their share of the prompt
    tokens of the requests that said (none said: unknown, not 0)."""
    said = [r for r in ok if r.cached_tokens is not None]
    if not said:
        return {}
    cached, prompt = sum(r.cached_tokens or 0 for r in said), sum(r.input_tokens for r in said)
    return {"cached_tokens_total": cached, "cache_hit_rate": cached / prompt if prompt else _NAN}


def _by(
    measured: Sequence[RequestRecord], key: Callable[[RequestRecord], Any], **options: Any
) -> dict[str, Summary]:
    """The requests of each value of ``key`` (a SPEED-Bench category, a session's turn)
    summarized alone; empty unless there are two or more (one's figures would repeat the
    overall ones). The server's gauge is not split: it has neither."""
    values = sorted({key(r) for r in measured if key(r) is not None})
    if len(values) < 2:
        return {}
    return {str(value): summarize([r for r in measured if key(r) == value], **options)
            for value in values}  # fmt: skip


def per_request_ms(
    records: Sequence[RequestRecord], *, time_scale: float = 1.0
) -> dict[str, list[float]]:
    """Each successful measured request's TTFT, TPOT, E2E and TTFAT in ms, and in an open
    loop its dispatch delay and latencies from the schedule (for bootstrap intervals); keyed
    by catalogue prefix."""
    scale = _check_time_scale(time_scale)
    out: dict[str, list[float]] = {prefix: [] for prefix in PER_REQUEST_PREFIXES}
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


def unplaced_token_notes(records: Sequence[RequestRecord]) -> list[str]:
    """Say where the server counted more tokens than the chunks' counts hold: over the
    OpenAI APIs a stream without a count in each chunk (``continuous_usage_stats`` dropped on
    the way: sglang-router 0.3.2 does, smg and SGLang itself do not) counts each chunk with
    text as one token, so tokens merged into one chunk, or that decoded to no text, are not
    placed, and ITL has that many samples fewer than tokens - 1 per request."""
    done = [r for r in records if r.success and not r.warmup and r.completion_tokens]
    unplaced = [(r.completion_tokens or 0) - sum(c.tokens for c in r.chunks) for r in done]
    missing = sum(n for n in unplaced if n > 0)
    if not missing:
        return []
    total = sum(r.completion_tokens or 0 for r in done)
    affected = sum(1 for n in unplaced if n > 0)
    return [
        f"ITL: {missing} of {total} output tokens ({affected} of {len(done)} requests) arrived "
        "in chunks that carried no token count, so they could not be placed and ITL has that "
        "many fewer samples: the stream had no per-chunk usage (stream_options."
        "continuous_usage_stats, which the client asks for, was dropped on the way: "
        "sglang-router 0.3.2 drops it, SGLang and smg honour it); /generate always counts"
    ]
