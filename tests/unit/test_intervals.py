"""Confidence bounds for SLO verdicts (:mod:`pytest_kimi.results.intervals`) and the
three-valued verdicts built on them, checked against exact binomial sums (``math.comb``,
not the library the module uses), printed t-table values and closed forms."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from pytest_kimi.results import intervals as iv
from pytest_kimi.results.layout import verdict_from_dict, verdict_to_dict
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.slo import (
    SloError,
    Verdict,
    evaluate,
    parse_confidence,
    parse_slo,
)


def _binom_cdf(k: int, n: int, p: Fraction) -> Fraction:
    """P(B <= k) for B ~ Binomial(n, p), exactly."""
    return sum((math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)), Fraction(0))


def _exact_ranks(n: int, p: Fraction, c: Fraction) -> tuple[int | None, int | None]:
    upper = next((k for k in range(1, n + 1) if _binom_cdf(k - 1, n, p) >= c), None)
    lower = [k for k in range(1, n + 1) if 1 - _binom_cdf(k - 1, n, p) >= c]
    return (lower[-1] if lower else None), upper


@pytest.mark.parametrize(
    ("n", "pct", "conf"),
    [(40, 95, 95), (59, 95, 95), (60, 95, 95), (100, 95, 95), (100, 99, 95), (200, 50, 99),
     (30, 90, 90), (200, 95, 975)],
)  # fmt: skip
def test_order_statistic_ranks_are_the_exact_binomial_ones(n: int, pct: int, conf: int) -> None:
    p, c = Fraction(pct, 100), Fraction(conf, 10 ** len(str(conf)))
    assert iv.quantile_ranks(n, float(p), float(c)) == _exact_ranks(n, p, c)


def test_a_p95_needs_59_requests_for_any_upper_bound_at_95_percent() -> None:
    assert 0.95**59 < 0.05 < 0.95**58
    assert iv.fewest_for_upper_bound(95, 0.95) == 59
    assert iv.quantile_ranks(58, 0.95, 0.95)[1] is None
    assert iv.quantile_ranks(59, 0.95, 0.95)[1] == 59  # the largest value bounds it
    assert iv.fewest_for_upper_bound(99, 0.95) == 299


def test_the_bounds_are_the_order_statistics_at_those_ranks() -> None:
    values = list(range(100, 0, -1))  # 100 down to 1: the k-th smallest is k
    bounds = iv.quantile_bounds(values, 95, 0.95)
    lo, hi = _exact_ranks(100, Fraction(95, 100), Fraction(95, 100))
    assert (bounds.lower, bounds.upper) == (lo, hi)
    assert (bounds.method, bounds.n) == ("order statistics", 100)
    few = iv.quantile_bounds(values[:40], 95, 0.95)
    assert math.isinf(few.upper) and few.lower > 0


def test_each_bound_covers_the_true_p95_at_least_as_often_as_promised() -> None:
    # 4,000 seeded samples of 100 exponential values: the true p95 is ln 20
    true = math.log(20)
    rng = np.random.default_rng(7)
    over = under = 0
    for _ in range(4000):
        b = iv.quantile_bounds(rng.exponential(size=100), 95, 0.95)
        over += b.upper >= true
        under += b.lower <= true
    # each at least 95%, up to the sampling error of 4,000 runs (3 sigma: 1%)
    assert over / 4000 >= 0.94 and under / 4000 >= 0.94


def test_the_mean_bounds_are_students_t_from_the_table() -> None:
    values = [float(v) for v in range(1, 41)]  # mean 20.5, s = sqrt(136.667)
    b = iv.mean_bounds(values, 0.95)
    half = 1.6849 * math.sqrt(sum((v - 20.5) ** 2 for v in values) / 39) / math.sqrt(40)
    assert (b.lower, b.upper) == pytest.approx((20.5 - half, 20.5 + half), rel=1e-4)
    assert b.method == "t"
    assert math.isinf(iv.mean_bounds([1.0], 0.95).upper)


def test_clopper_pearson_of_all_successes_is_alpha_to_the_one_over_n() -> None:
    b = iv.proportion_bounds(40, 40, 0.95)
    assert b.lower == pytest.approx(0.05 ** (1 / 40)) and b.upper == 1.0
    assert iv.proportion_bounds(0, 40, 0.95).upper == pytest.approx(1 - 0.05 ** (1 / 40))


def test_requests_needed_grow_as_the_limit_nears_the_measured_percentile() -> None:
    values = np.random.default_rng(1).lognormal(0, 0.5, 200)
    p95 = float(np.percentile(values, 95))
    far, near = (iv.quantile_requests_needed(values, 95, f * p95, 0.95) for f in (1.5, 1.05))
    assert far < near < iv.NEVER
    assert iv.quantile_requests_needed(values, 95, p95 * 0.5, 0.95) < near  # a clear fail
    share_at = sorted(values)[189]  # exactly 95% at or under it
    assert iv.quantile_requests_needed(values, 95, share_at, 0.95) == iv.NEVER


# ----------------------------------------------------------------------------- verdicts


def _records(ttfts_ms: list[float]) -> list[RequestRecord]:
    """One successful request per TTFT, each with two more tokens 100 ms apart."""
    out = []
    for i, ttft in enumerate(ttfts_ms):
        first = ttft / 1000
        out.append(RequestRecord(
            index=i, prompt_id=f"p{i}", nominal_input_tokens=8, max_output_tokens=3,
            send_time=0.0, first_token_time=first, end_time=first + 0.2,
            chunks=[Chunk(first, 1), Chunk(first + 0.1, 1), Chunk(first + 0.2, 1)],
            prompt_tokens=8, completion_tokens=3, success=True,
        ))  # fmt: skip
    return out


def _verdict(ttfts: list[float], slo: str, limit: str, confidence: float = 0.95) -> Verdict:
    from pytest_kimi.results.metrics import per_request_ms

    records = _records(ttfts)
    summary = summarize(records, percentiles=(95,))
    return evaluate(parse_slo(slo, limit, "cli"), summary, per_request_ms(records), confidence)


def test_forty_requests_can_fail_a_p95_slo_but_never_pass_it() -> None:
    ttfts = [float(v) for v in range(100, 4100, 100)]  # 100 ms .. 4 s
    far_under = _verdict(ttfts, "ttft_p95", "60min")
    assert far_under.outcome == "undecided" and math.isinf(far_under.bounds.upper)
    assert "that needs 59" in far_under.why and "never pass it" in far_under.why
    assert far_under.needed == 59
    over = _verdict(ttfts, "ttft_p95", "1s")  # 31 of 40 over a second
    assert over.outcome == "failed" and over.bounds.lower > 1000
    assert "UNDECIDED" in far_under.message() and "95% bounds" in far_under.message()


def test_a_p95_slo_passes_when_its_upper_bound_is_under_the_limit() -> None:
    ttfts = [float(v) for v in range(10, 1010, 10)]  # 100 requests, 10 ms .. 1 s
    passed = _verdict(ttfts, "ttft_p95", "1s")
    assert passed.outcome == "passed" and passed.bounds.upper <= 1000
    straddling = _verdict(ttfts, "ttft_p95", "955ms")
    assert straddling.outcome == "undecided"
    assert straddling.bounds.lower <= 955 < straddling.bounds.upper
    assert "straddle" in straddling.why and straddling.needed > 100


def test_a_mean_slo_is_judged_by_its_t_bounds() -> None:
    ttfts = [float(v) for v in range(100, 4100, 100)]  # mean 2,050 ms
    assert _verdict(ttfts, "ttft_mean", "3s").outcome == "passed"
    assert _verdict(ttfts, "ttft_mean", "1.5s").outcome == "failed"
    near = _verdict(ttfts, "ttft_mean", "2.1s")
    assert near.outcome == "undecided" and near.bounds.method == "t" and near.needed > 40


def test_run_wide_figures_and_itl_are_compared_without_an_interval() -> None:
    ttfts = [float(v) for v in range(100, 4100, 100)]
    throughput = _verdict(ttfts, "output_throughput", "0.1")
    assert throughput.bounds is None and throughput.outcome == "passed"
    assert "a figure of the whole run" in throughput.why
    itl = _verdict(ttfts, "itl_p95", "1s")
    assert itl.bounds is None and "not independent" in itl.why


def test_a_success_rate_floor_of_one_is_judged_on_the_runs_count() -> None:
    """Clopper-Pearson never puts a rate's lower bound at 100% (40 of 40: 92.8%), so at a
    confidence ``success_rate >= 1`` was undecided for ever; it asks about every request sent,
    a count, and is judged on it; a floor under 1 still has its bounds."""
    ttfts = [float(v) for v in range(100, 4100, 100)]
    every = _verdict(ttfts, "success_rate", "1")
    assert every.outcome == "passed" and every.bounds is None and "run's count" in every.why
    records = _records(ttfts)
    records[3].success = False
    summary = summarize(records, percentiles=(95,))
    one_failed = evaluate(parse_slo("success_rate", "1", "cli"), summary, None, 0.95)
    assert one_failed.outcome == "failed"
    most = _verdict(ttfts, "success_rate", "0.9")
    assert most.bounds is not None and most.outcome == "passed"  # 40/40: lower bound 92.8%


def test_without_a_confidence_the_verdict_is_the_point_comparison() -> None:
    ttfts = [float(v) for v in range(100, 4100, 100)]
    records = _records(ttfts)
    v = evaluate(parse_slo("ttft_p95", "60min", "cli"), summarize(records, percentiles=(95,)))
    assert v.bounds is None and v.outcome == "passed"


def test_a_verdict_keeps_its_bounds_through_the_summary_file() -> None:
    ttfts = [float(v) for v in range(100, 4100, 100)]
    verdict = _verdict(ttfts, "ttft_p95", "60min")
    saved = verdict_to_dict(verdict)
    assert saved["outcome"] == "undecided" and saved["interval"]["upper"] is None
    assert saved["requests_needed"] == 59
    back = verdict_from_dict(saved)
    assert (back.outcome, back.needed, back.why) == ("undecided", 59, verdict.why)


@pytest.mark.parametrize("text", ["0.5", "1", "1.2", "high", "0"])
def test_a_confidence_must_lie_over_a_half_and_under_one(text: str) -> None:
    with pytest.raises(SloError, match=f"--kimi-confidence: confidence '{text}'"):
        parse_confidence(text, "--kimi-confidence")
    assert parse_confidence("0.95", "x") == 0.95
