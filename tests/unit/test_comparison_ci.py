"""Bootstrap intervals in the comparison report, from per-request records."""

from __future__ import annotations

import json

import numpy as np

from pytest_kimi.report.comparison import LayoutResult, build_comparison, render_markdown
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord


def _records(ttft_s: np.ndarray, tpot_s: float, n_out: int = 8) -> list[RequestRecord]:
    out = []
    for i, ttft in enumerate(ttft_s):
        send = float(i)
        first = send + ttft
        chunks = [Chunk(first + k * tpot_s, 1) for k in range(n_out)]
        out.append(RequestRecord(i, f"p{i}", 100, n_out, send_time=send, first_token_time=first,
                                 end_time=chunks[-1].time, chunks=chunks, completion_tokens=n_out,
                                 success=True))  # fmt: skip
    return out


def _result(name: str, records: list[RequestRecord]) -> LayoutResult:
    return LayoutResult(name, name.upper(), summarize(records), records=records)


def test_latency_rows_carry_intervals_that_separate_real_from_noise():
    rng = np.random.default_rng(0)
    a = _records(rng.normal(1.0, 0.1, 40), 0.050)
    b = _records(rng.normal(1.0, 0.1, 40), 0.080)  # same TTFT distribution, TPOT +60 %
    model = build_comparison(
        [_result("a", a), _result("b", b)], run_id="r", backend="mock", time_scale=1.0
    )
    rows = {r["metric"]: r for r in model["rows"]}
    assert rows["tpot_mean"]["ci"]["b"]["excludes_zero"] is True
    assert rows["tpot_mean"]["ci"]["b"]["low"] > 0.5
    assert rows["ttft_mean"]["ci"]["b"]["excludes_zero"] is False
    assert "ci" not in rows["output_throughput"]  # only latencies get intervals
    json.dumps(model, allow_nan=False)
    text = render_markdown(model)
    assert "+60.00% [" in text and "]*" in text
    assert "95% bootstrap interval" in text
