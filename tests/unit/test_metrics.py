"""Unit tests for pytest_kimi.results.metrics: hand-computed expectations plus properties."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kimi.results.metrics import (
    DEFAULT_PERCENTILES,
    Distribution,
    distribution,
    goodput,
    summarize,
)
from pytest_kimi.results.records import Chunk, RequestRecord


def rec(
    index: int,
    send: float,
    first: float | None,
    end: float | None,
    chunks: Sequence[tuple[float, int]] = (),
    *,
    success: bool = True,
    nominal_in: int = 100,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    warmup: bool = False,
    error: str = "",
) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=f"p{index}",
        nominal_input_tokens=nominal_in,
        max_output_tokens=16,
        send_time=send,
        first_token_time=first,
        end_time=end,
        chunks=[Chunk(time=t, tokens=k) for t, k in chunks],
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        success=success,
        error=error,
        warmup=warmup,
    )


def base_records() -> list[RequestRecord]:
    """Four measured requests, worked out by hand below.

    A: sent 0.0, first token 0.5, end 2.5; chunks 1,1,2,1 tokens -> 5 output tokens (streamed
       count), 100 input tokens (nominal).
       TTFT 500 ms, E2E 2500 ms, TPOT (2500-500)/(5-1) = 500 ms.
       ITL: 1.0-0.5 = 0.5 s / 1 -> 500; 1.5-1.0 = 0.5 s / 2 -> 250, 250; 2.5-1.5 = 1 s -> 1000.
    B: sent 1.0, first 1.2, end 3.0; server says 3 completion / 200 prompt tokens (nominal 150).
       TTFT 200, E2E 2000, TPOT (2000-200)/2 = 900. ITL: 800, 1000.
    C: one output token: sent 2.0, first 2.4, end 2.4, 50 input tokens.
       TTFT 400, E2E 400, no TPOT, no ITL.
    D: failed, sent 0.5, ended 4.0 with an error; 70 nominal input tokens, never counted.
    """
    return [
        rec(0, 0.0, 0.5, 2.5, [(0.5, 1), (1.0, 1), (1.5, 2), (2.5, 1)]),
        rec(
            1,
            1.0,
            1.2,
            3.0,
            [(1.2, 1), (2.0, 1), (3.0, 1)],
            nominal_in=150,
            prompt_tokens=200,
            completion_tokens=3,
        ),
        rec(2, 2.0, 2.4, 2.4, [(2.4, 1)], nominal_in=50),
        rec(3, 0.5, None, 4.0, success=False, nominal_in=70, error="boom"),
    ]


def pstd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


# ----------------------------------------------------------------------------- distribution


def test_distribution_hand_computed() -> None:
    d = distribution([4.0, 1.0, 3.0, 2.0])
    assert d.count == 4
    assert d.mean == pytest.approx(2.5)  # 10 / 4
    assert d.median == pytest.approx(2.5)  # (2 + 3) / 2
    assert d.std == pytest.approx(math.sqrt(1.25))  # (2.25+0.25+0.25+2.25)/4, ddof=0
    assert (d.min, d.max) == (1.0, 4.0)
    # linear: rank = q/100 * (n-1) = q/100 * 3 over sorted [1, 2, 3, 4]
    assert d.percentile(50) == pytest.approx(2.5)  # rank 1.5
    assert d.percentile(90) == pytest.approx(3.7)  # rank 2.7 -> 3 + 0.7
    assert d.percentile(95) == pytest.approx(3.85)  # rank 2.85
    assert d.percentile(99) == pytest.approx(3.97)  # rank 2.97
    assert set(d.percentiles) == set(DEFAULT_PERCENTILES)


def test_distribution_to_dict_keys_and_custom_percentiles() -> None:
    d = distribution([1.0, 2.0], percentiles=(99.9, 95))
    assert list(d.to_dict()) == ["count", "mean", "median", "std", "min", "max", "p95", "p99.9"]
    assert d.to_dict()["p99.9"] == pytest.approx(1.999)  # rank 0.999 * 1
    assert d.percentile(99.9) == pytest.approx(1.999)


def test_distribution_percentile_not_computed_raises_clear_keyerror() -> None:
    d = distribution([1.0, 2.0])
    with pytest.raises(KeyError, match=r"percentile 97 was not computed.*p50, p90, p95, p99"):
        d.percentile(97)


def test_empty_distribution_is_all_nan_and_json_safe() -> None:
    d = distribution([])
    assert d.count == 0
    for value in (d.mean, d.median, d.std, d.min, d.max, *d.percentiles.values()):
        assert math.isnan(value)
    as_dict = d.to_dict()
    assert as_dict["count"] == 0
    assert all(v is None for k, v in as_dict.items() if k != "count")
    json.dumps(as_dict, allow_nan=False)


def test_distribution_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="outside"):
        distribution([1.0], percentiles=(950,))
    with pytest.raises(ValueError, match="finite"):
        distribution([1.0, float("nan")])


def test_distribution_matches_numpy() -> None:
    values = [3.0, 1.5, 9.0, 2.25, 7.0]
    d = distribution(values)
    assert d.std == pytest.approx(float(np.std(values)))
    assert d.percentile(95) == pytest.approx(float(np.percentile(values, 95)))


# ----------------------------------------------------------------------------- summarize


def test_summary_counts_tokens_duration_throughput() -> None:
    s = summarize(base_records())
    assert (s.completed, s.failed, s.total) == (3, 1, 4)
    assert s.success_rate == pytest.approx(0.75)
    # first send 0.0 (A) -> last end 4.0 (failed D still counts)
    assert s.duration_s == pytest.approx(4.0)
    # input: A 100 nominal + B 200 server-reported + C 50 = 350; D failed, excluded
    assert s.total_input_tokens == 350
    # output: A 5 streamed + B 3 server-reported + C 1 = 9
    assert s.total_output_tokens == 9
    assert s.request_throughput == pytest.approx(0.75)  # 3 / 4
    assert s.input_throughput == pytest.approx(87.5)  # 350 / 4
    assert s.output_throughput == pytest.approx(2.25)  # 9 / 4
    assert s.total_throughput == pytest.approx(89.75)  # 359 / 4
    assert s.percentiles == DEFAULT_PERCENTILES
    assert s.time_scale == 1.0


def test_summary_ttft() -> None:
    t = summarize(base_records()).ttft_ms
    # A 500, B 200, C 400; D failed -> excluded. Sorted [200, 400, 500].
    assert t.count == 3
    assert t.mean == pytest.approx(1100 / 3)
    assert t.median == pytest.approx(400)
    assert t.std == pytest.approx(pstd([500, 200, 400]))  # sqrt(46666.67 / 3) = 124.72
    assert (t.min, t.max) == (pytest.approx(200), pytest.approx(500))
    assert t.percentile(50) == pytest.approx(400)  # rank 0.5 * 2 = 1
    assert t.percentile(90) == pytest.approx(480)  # rank 1.8: 400 + 0.8 * 100
    assert t.percentile(95) == pytest.approx(490)  # rank 1.9
    assert t.percentile(99) == pytest.approx(498)  # rank 1.98


def test_summary_tpot_skips_one_token_outputs() -> None:
    t = summarize(base_records()).tpot_ms
    # A 500, B 900; C has 1 output token -> no TPOT.
    assert t.count == 2
    assert t.mean == pytest.approx(700)
    assert t.median == pytest.approx(700)
    assert t.std == pytest.approx(200)  # |900 - 700|
    assert (t.min, t.max) == (pytest.approx(500), pytest.approx(900))
    assert t.percentile(90) == pytest.approx(860)  # 500 + 0.9 * 400
    assert t.percentile(95) == pytest.approx(880)
    assert t.percentile(99) == pytest.approx(896)


def test_summary_itl_splits_multi_token_chunks() -> None:
    i = summarize(base_records()).itl_ms
    # A: 500, 250, 250, 1000 (the 2-token chunk gives two gaps of 500/2); B: 800, 1000.
    # Sorted [250, 250, 500, 800, 1000, 1000].
    values = [500, 250, 250, 1000, 800, 1000]
    assert i.count == 6
    assert i.mean == pytest.approx(3800 / 6)
    assert i.median == pytest.approx(650)  # (500 + 800) / 2
    assert i.std == pytest.approx(pstd(values))  # sqrt(608333.3 / 6) = 318.42
    assert (i.min, i.max) == (pytest.approx(250), pytest.approx(1000))
    assert i.percentile(90) == pytest.approx(1000)  # rank 4.5 between 1000 and 1000
    assert i.percentile(50) == pytest.approx(650)  # rank 2.5


def test_summary_e2e() -> None:
    e = summarize(base_records()).e2e_ms
    # A 2500, B 2000, C 400. Sorted [400, 2000, 2500].
    assert e.count == 3
    assert e.mean == pytest.approx(4900 / 3)
    assert e.median == pytest.approx(2000)
    assert e.std == pytest.approx(pstd([2500, 2000, 400]))
    assert e.percentile(90) == pytest.approx(2400)  # rank 1.8: 2000 + 0.8 * 500
    assert e.percentile(95) == pytest.approx(2450)
    assert e.percentile(99) == pytest.approx(2490)


def test_summary_peaks_failed_request_holds_a_slot() -> None:
    s = summarize(base_records())
    # Exact: at t=2.0 A [0,2.5), B [1,3), C [2,2.4) and failed D [0.5,4) are all in flight.
    assert s.peak_concurrency == 4
    # Bucketed (successful only, as bench_serving): A 0..2, B 1..3, C 2..2 -> bucket 2 has 3.
    assert s.peak_concurrency_bucketed == 3


def test_single_request() -> None:
    r = rec(0, 10.0, 10.1, 10.5, [(10.1, 1), (10.3, 1), (10.5, 1)])
    s = summarize([r])
    assert (s.completed, s.failed) == (1, 0)
    assert s.duration_s == pytest.approx(0.5)
    assert s.request_throughput == pytest.approx(2.0)  # 1 / 0.5
    assert s.output_throughput == pytest.approx(6.0)  # 3 / 0.5
    assert s.ttft_ms.mean == pytest.approx(100)
    assert s.ttft_ms.std == 0.0
    assert s.e2e_ms.percentile(99) == pytest.approx(500)
    assert s.tpot_ms.mean == pytest.approx(200)  # (500 - 100) / 2
    assert s.itl_ms.count == 2
    assert s.itl_ms.mean == pytest.approx(200)
    assert (s.peak_concurrency, s.peak_concurrency_bucketed) == (1, 1)


def test_warmup_is_ignored_completely() -> None:
    # A warmup spanning [-10, 100) would dominate duration, peaks and latencies if counted.
    warm = rec(99, -10.0, -9.0, 100.0, [(-9.0, 1), (100.0, 1)], warmup=True)
    failed_warm = rec(98, -20.0, None, 200.0, success=False, warmup=True)
    assert (
        summarize([*base_records(), warm, failed_warm]).to_dict()
        == summarize(base_records()).to_dict()
    )
    only_warm = summarize([warm])
    assert (only_warm.completed, only_warm.failed, only_warm.duration_s) == (0, 0, 0.0)


def test_time_scale_applies_to_every_time_difference() -> None:
    s = summarize(base_records(), time_scale=40)
    assert s.time_scale == 40.0
    assert s.duration_s == pytest.approx(160.0)  # 4 s wall * 40
    assert s.request_throughput == pytest.approx(3 / 160)
    assert s.output_throughput == pytest.approx(9 / 160)
    assert s.ttft_ms.mean == pytest.approx(40 * 1100 / 3)
    assert s.tpot_ms.mean == pytest.approx(40 * 700)
    assert s.itl_ms.median == pytest.approx(40 * 650)
    assert s.e2e_ms.max == pytest.approx(40 * 2500)
    assert s.peak_concurrency == 4  # a sweep does not depend on the scale


def test_time_scale_is_applied_before_bucketing() -> None:
    # Wall [0, 0.5) and [0.6, 0.9): both in bucket 0 at scale 1; at scale 10 they become
    # [0, 5) -> buckets 0..5 and [6, 9) -> buckets 6..9, disjoint.
    records = [rec(0, 0.0, 0.1, 0.5, [(0.1, 1)]), rec(1, 0.6, 0.7, 0.9, [(0.7, 1)])]
    assert summarize(records).peak_concurrency_bucketed == 2
    assert summarize(records, time_scale=10).peak_concurrency_bucketed == 1
    assert summarize(records, time_scale=10).peak_concurrency == 1


def test_buckets_are_relative_to_first_send() -> None:
    # Sent at 0.5 and 1.2: absolute int() would put them in buckets 0 and 1; relative to the
    # first send they are [0, 0.4] and [0.7, 0.9], both bucket 0.
    records = [rec(0, 0.5, 0.6, 0.9, [(0.6, 1)]), rec(1, 1.2, 1.3, 1.4, [(1.3, 1)])]
    assert summarize(records).peak_concurrency_bucketed == 2
    assert summarize(records).peak_concurrency == 1


def test_back_to_back_requests_bucketed_two_exact_one() -> None:
    # [0, 1) then [1, 2): bench_serving counts both in bucket 1 (inclusive ends).
    records = [rec(0, 0.0, 0.5, 1.0, [(0.5, 1)]), rec(1, 1.0, 1.5, 2.0, [(1.5, 1)])]
    s = summarize(records)
    assert s.peak_concurrency_bucketed == 2
    assert s.peak_concurrency == 1


def test_invalid_time_scale() -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="time_scale"):
            summarize(base_records(), time_scale=bad)


def test_failed_requests_counted_not_in_latency() -> None:
    records = [
        rec(0, 0.0, None, 1.0, success=False, error="HTTP 500"),
        rec(1, 0.5, 0.6, 2.0, [(0.6, 1), (2.0, 1)], success=False, error="stream cut"),
        rec(2, 0.2, None, None, success=False, error="connect refused"),  # no end_time
    ]
    s = summarize(records)
    assert (s.completed, s.failed, s.total) == (0, 3, 3)
    assert s.success_rate == 0.0
    assert s.duration_s == pytest.approx(2.0)  # first send 0.0 -> last end 2.0
    assert s.request_throughput == 0.0
    assert s.total_output_tokens == 0
    assert s.ttft_ms.count == s.itl_ms.count == s.e2e_ms.count == 0
    # [0, 1) and [0.5, 2) overlap; the one without end_time is skipped.
    assert s.peak_concurrency == 2
    assert s.peak_concurrency_bucketed == 0  # bench_serving counts successes only


def test_empty_input() -> None:
    s = summarize([])
    assert (s.completed, s.failed, s.total) == (0, 0, 0)
    assert s.duration_s == 0.0
    assert math.isnan(s.success_rate)
    for value in (
        s.request_throughput,
        s.input_throughput,
        s.output_throughput,
        s.total_throughput,
    ):
        assert math.isnan(value)
    assert s.ttft_ms.count == 0 and math.isnan(s.ttft_ms.mean)
    assert (s.peak_concurrency, s.peak_concurrency_bucketed) == (0, 0)
    out = json.loads(json.dumps(s.to_dict(), allow_nan=False))
    assert out["request_throughput"] is None
    assert out["success_rate"] is None
    assert out["mean_ttft_ms"] is None
    assert out["distributions"]["ttft_ms"]["p95"] is None


def test_zero_duration_gives_nan_throughput() -> None:
    r = rec(0, 1.0, 1.0, 1.0, [(1.0, 1)])
    s = summarize([r])
    assert s.duration_s == 0.0
    assert math.isnan(s.request_throughput) and math.isnan(s.output_throughput)
    assert math.isnan(goodput([r], {}))


def test_successful_request_without_first_token_time() -> None:
    # No TTFT can be measured; it must not raise, and E2E is still known.
    r = rec(0, 0.0, None, 1.0, [], completion_tokens=0)
    s = summarize([r])
    assert s.ttft_ms.count == 0 and s.tpot_ms.count == 0
    assert s.e2e_ms.mean == pytest.approx(1000)


# ----------------------------------------------------------------------------- to_dict


def expected_keys(pkeys: list[str]) -> set[str]:
    keys = {
        "completed",
        "failed",
        "success_rate",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "total_throughput",
        "time_scale",
        "peak_concurrency_exact",
        "max_concurrent_requests_bucketed",
        "percentiles",
        "distributions",
        "goodput",
        "goodput_limits_ms",
        "total_reasoning_tokens",
        "total_answer_tokens",
        "spec_accept_length",
        "spec_accept_length_source",
        "cached_tokens_total",
        "cache_hit_rate",
        "by_category",
        "by_turn",
    }
    for m in ("ttft", "tpot", "itl", "e2e_latency", "ttfat"):
        keys |= {f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms"}
        keys |= {f"{p}_{m}_ms" for p in pkeys}
    return keys


def test_to_dict_key_names_and_values() -> None:
    d = summarize(base_records()).to_dict()
    assert set(d) == expected_keys(["p50", "p90", "p95", "p99"])
    assert d["completed"] == 3 and d["failed"] == 1
    assert d["duration"] == pytest.approx(4.0)
    assert d["total_throughput"] == pytest.approx(89.75)
    assert d["mean_e2e_latency_ms"] == pytest.approx(4900 / 3)
    assert d["p99_ttft_ms"] == pytest.approx(498)
    assert d["p90_tpot_ms"] == pytest.approx(860)
    assert d["median_itl_ms"] == pytest.approx(650)
    assert d["peak_concurrency_exact"] == 4
    assert d["max_concurrent_requests_bucketed"] == 3
    assert d["percentiles"] == [50.0, 90.0, 95.0, 99.0]
    assert set(d["distributions"]) == {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "ttfat_ms"}
    assert d["distributions"]["tpot_ms"]["count"] == 2
    assert d["distributions"]["e2e_ms"]["p95"] == pytest.approx(2450)


def test_to_dict_custom_percentiles_keep_bench_serving_p99() -> None:
    s = summarize(base_records(), percentiles=(99.9, 95))
    assert s.percentiles == (95.0, 99.9)
    d = s.to_dict()
    # p99 is always there: bench_serving's output file always has p99_*.
    assert set(d) == expected_keys(["p95", "p99", "p99.9"])
    assert d["p99.9_ttft_ms"] == pytest.approx(499.8)  # rank 1.998: 400 + 0.998 * 100
    assert d["percentiles"] == [95.0, 99.9]


def test_to_dict_json_valid_with_nan_as_none() -> None:
    # Only one-token outputs: no TPOT and no ITL at all -> NaN stats must become null.
    records = [rec(0, 0.0, 0.3, 0.3, [(0.3, 1)]), rec(1, 0.1, 0.4, 0.4, [(0.4, 1)])]
    text = json.dumps(summarize(records).to_dict(), allow_nan=False)
    out = json.loads(text)
    assert out["mean_tpot_ms"] is None and out["p99_itl_ms"] is None
    assert out["distributions"]["tpot_ms"] == {
        "count": 0,
        "mean": None,
        "median": None,
        "std": None,
        "min": None,
        "max": None,
        "p50": None,
        "p90": None,
        "p95": None,
        "p99": None,
    }
    assert out["mean_ttft_ms"] == pytest.approx(300)


# ----------------------------------------------------------------------------- metric()


def test_metric_names() -> None:
    s = summarize(base_records())
    assert s.metric("ttft_mean") == pytest.approx(1100 / 3)
    assert s.metric("ttft_median") == pytest.approx(400)
    assert s.metric("ttft_p95") == pytest.approx(490)
    assert s.metric("ttft_p99") == pytest.approx(498)
    assert s.metric("tpot_p90") == pytest.approx(860)
    assert s.metric("tpot_std") == pytest.approx(200)
    assert s.metric("itl_min") == pytest.approx(250)
    assert s.metric("e2e_max") == pytest.approx(2500)
    assert s.metric("e2e_p50") == pytest.approx(2000)
    assert s.metric("request_throughput") == pytest.approx(0.75)
    assert s.metric("input_throughput") == pytest.approx(87.5)
    assert s.metric("output_throughput") == pytest.approx(2.25)
    assert s.metric("total_throughput") == pytest.approx(89.75)
    assert s.metric("duration") == pytest.approx(4.0)
    assert s.metric("success_rate") == pytest.approx(0.75)
    assert s.metric("completed") == 3.0
    assert s.metric("failed") == 1.0
    assert s.metric("peak_concurrency") == 4.0
    for name in s.metric_names():
        assert isinstance(s.metric(name), float)
    assert "ttft_p95" in s.metric_names() and "e2e_std" in s.metric_names()


def test_metric_custom_percentile_name() -> None:
    s = summarize(base_records(), percentiles=(99.9,))
    assert s.metric("ttft_p99.9") == pytest.approx(499.8)
    with pytest.raises(KeyError):
        s.metric("ttft_p95")  # not configured this time


@pytest.mark.parametrize(
    "name", ["ttft_p97", "latency", "ttft", "ttft_", "foo_mean", "ttft_pxx", "e2e_latency_mean"]
)
def test_metric_unknown_name_lists_valid_names(name: str) -> None:
    s = summarize(base_records())
    with pytest.raises(KeyError, match=r"valid names: ") as info:
        s.metric(name)
    message = str(info.value)
    assert repr(name) in message
    for valid in ("ttft_p95", "e2e_mean", "request_throughput", "peak_concurrency"):
        assert valid in message


# ----------------------------------------------------------------------------- goodput


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({}, 3 / 4),  # every success counts: 3 requests over 4 s
        ({"ttft": 450}, 2 / 4),  # A 500 misses; B 200, C 400 meet
        ({"tpot": 600}, 2 / 4),  # B 900 misses; A 500 meets; C has no TPOT -> passes
        ({"e2e": 2000}, 2 / 4),  # A 2500 misses; B exactly 2000 meets (<=); C 400
        ({"ttft": 450, "tpot": 600}, 1 / 4),  # only C meets both
        ({"ttft": 100, "tpot": 100, "e2e": 100}, 0.0),
    ],
)
def test_goodput(limits: dict[str, float], expected: float) -> None:
    assert goodput(base_records(), limits) == pytest.approx(expected)


def test_goodput_time_scale_and_warmup() -> None:
    warm = rec(99, -10.0, -9.99, 100.0, [(-9.99, 1)], warmup=True)
    # scale 2: TTFT A 1000, B 400, C 800 -> only B meets 450; duration 8 s -> 1/8.
    assert goodput([*base_records(), warm], {"ttft": 450}, time_scale=2) == pytest.approx(1 / 8)


def test_goodput_rejects_unknown_limit_and_handles_empty() -> None:
    with pytest.raises(ValueError, match="valid keys: ttft, tpot, e2e"):
        goodput(base_records(), {"ttft_p95": 100})
    assert math.isnan(goodput([], {"ttft": 100}))


# ----------------------------------------------------------------------------- properties


@st.composite
def records_strategy(draw: st.DrawFn, *, allow_failures: bool = True) -> list[RequestRecord]:
    n = draw(st.integers(min_value=0, max_value=12))
    times = st.floats(min_value=0.0, max_value=20.0, allow_nan=False, allow_infinity=False)
    out: list[RequestRecord] = []
    for i in range(n):
        send = draw(times)
        ttft = draw(st.floats(min_value=0.0, max_value=5.0))
        decode = draw(st.floats(min_value=0.0, max_value=10.0))
        first = send + ttft
        end = first + decode
        tokens = draw(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=6))
        offsets = sorted(
            draw(
                st.lists(
                    st.floats(min_value=0.0, max_value=1.0),
                    min_size=len(tokens) - 1,
                    max_size=len(tokens) - 1,
                )
            )
        )
        chunk_times = [first] + [first + o * decode for o in offsets]
        success = draw(st.booleans()) if allow_failures else True
        out.append(
            rec(
                i,
                send,
                first,
                end,
                list(zip(chunk_times, tokens, strict=True)),
                success=success,
                warmup=draw(st.sampled_from([False, False, False, True])),
                nominal_in=draw(st.integers(min_value=1, max_value=5000)),
            )
        )
    return out


def _le(a: float, b: float) -> bool:
    return a <= b + 1e-9 * max(1.0, abs(a), abs(b))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50))
def test_property_distribution_order(values: list[float]) -> None:
    d = distribution(values)
    assert _le(d.min, d.mean) and _le(d.mean, d.max)
    assert _le(d.min, d.median)
    assert _le(d.median, d.percentile(95))
    assert _le(d.percentile(95), d.percentile(99))
    assert _le(d.percentile(99), d.max)
    assert d.std >= 0


@settings(max_examples=200, deadline=None)
@given(records_strategy(), st.sampled_from([1.0, 2.5, 40.0]))
def test_property_summary(records: list[RequestRecord], scale: float) -> None:
    s = summarize(records, time_scale=scale)
    measured = [r for r in records if not r.warmup]
    for dist in (s.ttft_ms, s.tpot_ms, s.itl_ms, s.e2e_ms):
        if dist.count:
            assert _le(dist.min, dist.mean) and _le(dist.mean, dist.max)
            assert _le(dist.median, dist.percentile(95))
            assert _le(dist.percentile(95), dist.percentile(99))
            assert _le(dist.percentile(99), dist.max)
    if s.duration_s > 0:
        assert s.output_throughput * s.duration_s == pytest.approx(s.total_output_tokens)
        assert s.request_throughput * s.duration_s == pytest.approx(s.completed)
    assert s.peak_concurrency <= len(measured)
    assert s.peak_concurrency_bucketed <= s.completed
    assert s.completed + s.failed == len(measured)
    json.dumps(s.to_dict(), allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(records_strategy(allow_failures=False), st.sampled_from([1.0, 3.0, 40.0]))
def test_property_exact_peak_at_most_bucketed(records: list[RequestRecord], scale: float) -> None:
    # Holds when every request succeeded: the bucketed count (like bench_serving's) ignores
    # failures, which the exact sweep includes.
    s = summarize(records, time_scale=scale)
    assert s.peak_concurrency <= s.peak_concurrency_bucketed


def test_distribution_is_frozen() -> None:
    d = distribution([1.0])
    assert isinstance(d, Distribution)
    with pytest.raises(AttributeError):
        d.mean = 2.0  # type: ignore[misc]


# ----------------------------------------------------------------------------- reasoning


def reasoning_record(index: int, send: float, reasoning: int, answer: int) -> RequestRecord:
    """A chat stream whose first ``reasoning`` tokens were thinking: one token per chunk at
    0.1 s gaps from 0.5 s after send, answer after it; usage said reasoning + answer."""
    times = [send + 0.5 + 0.1 * k for k in range(reasoning + answer)]
    r = rec(index, send, times[0], times[-1] + 0.05, [(t, 1) for t in times],
            completion_tokens=reasoning + answer)  # fmt: skip
    r.first_answer_time = times[reasoning] if answer else None
    r.reasoning_tokens = reasoning
    return r


def test_reasoning_counts_in_ttft_and_tpot_and_ttfat_waits_for_the_answer() -> None:
    # A: 3 thinking + 2 answer tokens, sent at 0: TTFT 500, TTFAT 800, E2E 950,
    #    TPOT (950 - 500) / 4 = 112.5. B: no thinking, sent at 1: TTFT = TTFAT = 500.
    s = summarize([reasoning_record(0, 0.0, 3, 2), reasoning_record(1, 1.0, 0, 4)])
    assert s.ttft_ms.mean == pytest.approx(500)
    assert s.ttfat_ms.min == pytest.approx(500) and s.ttfat_ms.max == pytest.approx(800)
    assert s.tpot_ms.min == pytest.approx(112.5)
    assert s.itl_ms.count == 4 + 3  # every gap, thinking included
    assert (s.total_output_tokens, s.total_reasoning_tokens, s.total_answer_tokens) == (9, 3, 6)
    assert s.metric("ttfat_p95") == s.ttfat_ms.percentile(95)
    assert s.metric("total_reasoning_tokens") == 3.0
    d = s.to_dict()
    assert d["mean_ttfat_ms"] == pytest.approx(650)
    assert (d["total_reasoning_tokens"], d["total_answer_tokens"]) == (3, 6)


def test_a_request_that_only_thought_has_ttft_but_no_ttfat() -> None:
    s = summarize([reasoning_record(0, 0.0, 4, 0)])
    assert s.completed == 1 and s.ttft_ms.count == 1
    assert s.ttfat_ms.count == 0 and math.isnan(s.metric("ttfat_mean"))
    assert s.total_answer_tokens == 0


def test_per_request_samples_carry_ttfat() -> None:
    from pytest_kimi.results.metrics import per_request_ms

    samples = per_request_ms([reasoning_record(0, 0.0, 3, 2)], time_scale=2.0)
    assert samples["ttft"] == [pytest.approx(1000)]
    assert samples["ttfat"] == [pytest.approx(1600)]


def test_summary_json_of_an_older_run_reads_without_the_reasoning_keys() -> None:
    from pytest_kimi.results.summary import Summary

    new = summarize(base_records(), percentiles=(50, 95)).to_dict()
    old = {k: v for k, v in new.items() if "ttfat" not in k and "reasoning" not in k}
    old.pop("total_answer_tokens")
    old["distributions"] = {k: v for k, v in new["distributions"].items() if k != "ttfat_ms"}
    back = Summary.from_dict(json.loads(json.dumps(old)))
    assert back.total_reasoning_tokens == 0
    assert back.total_answer_tokens == back.total_output_tokens == new["total_output_tokens"]
    assert back.ttfat_ms.count == 0 and math.isnan(back.metric("ttfat_p95"))
    assert back.metric("ttft_p95") == new["p95_ttft_ms"]


def test_summary_with_reasoning_round_trips_exactly() -> None:
    from pytest_kimi.results.summary import Summary

    records = [reasoning_record(0, 0.0, 3, 2), reasoning_record(1, 1.0, 0, 4)]
    s = summarize(records, goodput_limits_ms={"ttft": 600.0})  # no NaN: equality is exact
    back = Summary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


def test_records_of_an_older_run_take_the_first_token_as_the_first_answer() -> None:
    # before reasoning was told apart the client timed only answer text
    line = rec(0, 0.0, 0.5, 1.0, [(0.5, 1)], completion_tokens=1).to_json()
    data = json.loads(line)
    del data["first_answer_time"], data["reasoning_tokens"]
    back = RequestRecord.from_dict(data)
    assert back.first_answer_time == 0.5 and back.reasoning_tokens == 0
    assert RequestRecord.from_dict(json.loads(reasoning_record(0, 0.0, 3, 2).to_json())) == (
        reasoning_record(0, 0.0, 3, 2)
    )


def test_latencies_start_where_the_record_says_bench_servings_by_default():
    # issued at 1.0, connected and sent at 1.2, first token at 1.5, end at 2.0
    record = rec(0, 1.2, 1.5, 2.0, [(1.5, 1), (2.0, 1)])
    record.start_time = 1.0
    from_request = summarize([replace(record, clock_start="request")])
    from_send = summarize([replace(record, clock_start="send")])
    assert from_request.ttft_ms.mean == pytest.approx(500.0)
    assert from_request.e2e_ms.mean == pytest.approx(1000.0)
    assert from_request.duration_s == pytest.approx(1.0)
    assert from_send.ttft_ms.mean == pytest.approx(300.0)
    assert from_send.e2e_ms.mean == pytest.approx(800.0)
    assert from_send.tpot_ms.mean == pytest.approx(from_request.tpot_ms.mean)
    assert from_request.tpot_ms.mean == pytest.approx(500.0)


def test_a_record_written_before_the_choice_existed_reads_back_timed_from_its_send():
    data = json.loads(rec(0, 1.2, 1.5, 2.0).to_json())
    for name in ("clock_start", "connect_time", "connected_time", "sent_time"):
        del data[name]
    data["start_time"] = 1.0
    old = RequestRecord.from_dict(data)
    assert old.clock_start == "send" and old.latency_start == 1.2


def _spec_record(index: int, tokens: int, verify: int | None, category: str) -> RequestRecord:
    record = rec(index, 0.0, 0.5, 2.5, [(0.5, 1), (2.5, tokens - 1)], completion_tokens=tokens)
    record.spec_verify_ct, record.category = verify, category
    record.spec_accept_length = tokens / verify if verify else None
    return record


def test_spec_accept_length_weighs_tokens_over_verify_steps() -> None:
    """SGLang's per-request accept length is completion_tokens / spec_verify_ct; the run's is
    the same ratio over every request that reports its steps."""
    records = [_spec_record(0, 300, 100, "low"), _spec_record(1, 100, 50, "high"),
               _spec_record(2, 80, None, "high")]  # fmt: skip
    s = summarize(records)
    assert s.spec_accept_length == pytest.approx(400 / 150)
    assert s.spec_accept_length_source == "meta_info"
    assert s.metric("spec_accept_length") == s.spec_accept_length
    assert s.figures()["spec_accept_length"] == s.spec_accept_length
    # counts in the responses win over the server's gauge
    assert summarize(records, server_accept_length=9.0).spec_accept_length == s.spec_accept_length


def test_without_counts_the_servers_gauge_gives_the_accept_length() -> None:
    records = [_spec_record(0, 300, None, "low")]
    s = summarize(records, server_accept_length=2.7)
    assert (s.spec_accept_length, s.spec_accept_length_source) == (2.7, "server")
    plain = summarize(records, server_accept_length=0.0)  # a server that does not speculate
    assert math.isnan(plain.spec_accept_length) and plain.spec_accept_length_source is None
    assert "spec_accept_length" not in plain.figures()


def test_every_metric_is_split_by_category() -> None:
    from pytest_kimi.results.summary import Summary

    records = [_spec_record(0, 300, 100, "low_entropy"), _spec_record(1, 100, 50, "high_entropy"),
               _spec_record(2, 120, 60, "high_entropy")]  # fmt: skip
    s = summarize(records, percentiles=(50, 95))
    assert sorted(s.by_category) == ["high_entropy", "low_entropy"]
    low, high = s.by_category["low_entropy"], s.by_category["high_entropy"]
    assert (low.completed, high.completed) == (1, 2)
    assert low.spec_accept_length == 3.0 and high.spec_accept_length == 2.0
    assert high.tpot_ms.mean == pytest.approx(summarize(records[1:]).tpot_ms.mean)
    assert low.by_category == {}  # one level
    data = json.loads(json.dumps(s.to_dict()))
    assert data["by_category"]["low_entropy"]["spec_accept_length"] == 3.0
    assert data["by_category"]["high_entropy"]["mean_tpot_ms"] == high.tpot_ms.mean
    back = Summary.from_dict(data)
    assert back.by_category["high_entropy"].tpot_ms == high.tpot_ms
    assert back.spec_accept_length == s.spec_accept_length
    # one category (or none): nothing to split
    assert summarize([_spec_record(0, 300, 100, "low")]).by_category == {}
    assert summarize(base_records()).by_category == {}


def test_sessions_give_the_prefix_cache_figures_and_every_figure_per_turn() -> None:
    from pytest_kimi.results.summary import Summary

    def turn(index: int, session: str, k: int, send: float, ttft: float, cached: int | None):
        first, end = send + ttft, send + ttft + 1.0
        r = rec(index, send, first, end, [(first, 1), (end, 1)], prompt_tokens=1000 * (k + 1))
        r.session_id, r.turn, r.cached_tokens = session, k, cached
        return r

    records = [turn(0, "a", 0, 0.0, 0.8, 0), turn(1, "a", 1, 3.0, 0.2, 900),
               turn(2, "b", 0, 0.5, 0.9, 0), turn(3, "b", 1, 3.5, 0.4, 1500)]  # fmt: skip
    s = summarize(records)
    assert s.cached_tokens_total == 2400
    assert s.cache_hit_rate == pytest.approx(2400 / 6000)
    assert sorted(s.by_turn) == ["0", "1"]
    first, second = s.by_turn["0"], s.by_turn["1"]
    assert first.ttft_ms.mean == pytest.approx(850) and second.ttft_ms.mean == pytest.approx(300)
    assert (first.cache_hit_rate, second.cache_hit_rate) == (0.0, pytest.approx(2400 / 4000))
    assert first.by_turn == {}  # one level
    back = Summary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.by_turn["1"].ttft_ms == second.ttft_ms
    assert (back.cached_tokens_total, back.cache_hit_rate) == (2400, s.cache_hit_rate)
    # no server said what it cached: unknown, never 0 %
    quiet = summarize([turn(0, "a", 0, 0.0, 0.8, None), turn(1, "a", 1, 3.0, 0.2, None)])
    assert quiet.cached_tokens_total is None and math.isnan(quiet.cache_hit_rate)
    assert summarize(base_records()).by_turn == {}  # single-turn requests: nothing to split
