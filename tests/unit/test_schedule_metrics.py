"""Open-loop figures: dispatch delay and latencies from the schedule, from hand-built records.

Each record keeps the instant its schedule meant it to leave (``intended_time``); the
figures are differences of the record's own stamps, worked out by hand here.
"""

from __future__ import annotations

import json

import pytest

from pytest_kimi.report.comparison import build_comparison, render_markdown
from pytest_kimi.results import catalogue
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.metrics import per_request_ms, summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.summary import Summary
from pytest_kimi.run.notes import dispatch_notes


def rec(index: int, due: float | None, send: float, first: float, end: float) -> RequestRecord:
    """A request due at ``due``, sent at ``send``, first token at ``first``, done at ``end``
    (seconds), four output tokens."""
    return RequestRecord(
        index=index, prompt_id=f"p{index}", nominal_input_tokens=100, max_output_tokens=4,
        send_time=send, first_token_time=first, end_time=end, success=True,
        chunks=[Chunk(first, 1), Chunk(end, 3)], completion_tokens=4, prompt_tokens=100,
        intended_time=due,
    )  # fmt: skip


# due 0.0 / 0.1 / 0.2 / 0.3; sent 1 ms, 2 ms, 40 ms and 4 ms late; TTFT 100 ms; E2E 400 ms
OPEN = [
    rec(0, 0.0, 0.001, 0.101, 0.401),
    rec(1, 0.1, 0.102, 0.202, 0.502),
    rec(2, 0.2, 0.240, 0.340, 0.640),
    rec(3, 0.3, 0.304, 0.404, 0.704),
]
LATE_MS = [1.0, 2.0, 40.0, 4.0]


def test_dispatch_delay_is_the_send_less_the_scheduled_instant():
    summary = summarize(OPEN)
    assert summary.open_loop
    delay = summary.dispatch_delay_ms
    assert delay.count == 4
    assert delay.mean == pytest.approx(sum(LATE_MS) / 4)
    assert delay.max == pytest.approx(40.0) and delay.min == pytest.approx(1.0)
    assert summary.metric("dispatch_delay_p50") == pytest.approx(3.0)  # between 2 and 4


def test_latencies_from_the_schedule_add_the_dispatch_delay_to_each_request():
    summary = summarize(OPEN)
    ttft, e2e = summary.ttft_from_schedule_ms, summary.e2e_from_schedule_ms
    assert summary.ttft_ms.max == pytest.approx(100.0) and summary.ttft_ms.min == pytest.approx(100)
    assert ttft.max == pytest.approx(140.0) and ttft.min == pytest.approx(101.0)
    assert e2e.max == pytest.approx(440.0) and e2e.mean == pytest.approx(400 + sum(LATE_MS) / 4)
    samples = per_request_ms(OPEN)
    assert samples["dispatch_delay"] == pytest.approx(LATE_MS)
    assert samples["ttft_from_schedule"] == pytest.approx([100 + x for x in LATE_MS])


def test_time_scale_multiplies_the_delay_like_every_other_latency():
    assert summarize(OPEN, time_scale=10).dispatch_delay_ms.max == pytest.approx(400.0)


def test_a_closed_loop_has_no_schedule_figures():
    closed = [rec(r.index, None, r.send_time, r.first_token_time, r.end_time) for r in OPEN]
    summary = summarize(closed)
    assert not summary.open_loop and summary.dispatch_delay_ms.count == 0
    assert not any(name.startswith("dispatch_delay") for name in summary.figures())
    assert all(per_request_ms(closed)[p] == [] for p in catalogue.SCHEDULE_PREFIXES)


def test_the_summary_file_keeps_the_figures_under_bench_serving_style_keys():
    summary = summarize(OPEN)
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["max_dispatch_delay_ms"] == pytest.approx(40.0)
    assert data["mean_dispatch_delay_ms"] == pytest.approx(sum(LATE_MS) / 4)
    assert data["p99_dispatch_delay_ms"] == summary.metric("dispatch_delay_p99")
    assert data["p50_dispatch_delay_ms"] == pytest.approx(3.0)
    assert data["p99_ttft_from_schedule_ms"] == summary.metric("ttft_from_schedule_p99")
    assert data["max_e2e_from_schedule_ms"] == pytest.approx(440.0)
    assert Summary.from_dict(data).to_dict() == summary.to_dict()  # (NaN != NaN as fields)


def test_a_summary_file_from_before_the_schedule_figures_reads_as_closed_loop():
    data = summarize(OPEN).to_dict()
    for prefix in catalogue.SCHEDULE_PREFIXES:
        del data["distributions"][f"{prefix}_ms"]
    old = Summary.from_dict(data)
    assert not old.open_loop and old.ttft_ms == summarize(OPEN).ttft_ms


def test_catalogue_names_and_keys_of_the_schedule_figures():
    p99 = catalogue.metric("dispatch_delay_p99")
    assert (p99.prefix, p99.stat, p99.percentile) == ("dispatch_delay", "p99", 99.0)
    assert p99.bench_key == "p99_dispatch_delay_ms" and p99.per_request and p99.unit == "ms"
    assert catalogue.metric("dispatch_delay_max").bench_key == "max_dispatch_delay_ms"
    assert catalogue.metric("ttft_max").bench_key is None  # bench_serving writes no max
    assert catalogue.metric("ttft_from_schedule_p95").label == "TTFT from schedule p95"
    assert catalogue.sloable(catalogue.metric("ttft_from_schedule_p99"))
    assert catalogue.latency_prefix("ttft_p95") == "ttft"
    assert catalogue.latency_prefix("output_throughput") == ""
    with pytest.raises(catalogue.UnknownMetric):
        catalogue.metric("dispatch_p99")


def test_the_comparison_adds_the_schedule_rows_only_for_an_open_loop():
    def model(records: list[RequestRecord]) -> dict:
        results = [LayoutResult(name, f"{name}-case", summarize(records), records=records)
                   for name in ("a", "b")]  # fmt: skip
        return build_comparison(results, run_id="r", backend="mock", time_scale=1.0)

    open_md = render_markdown(model(OPEN))
    assert "Dispatch delay p99" in open_md and "TTFT from schedule p99" in open_md
    closed = [rec(r.index, None, r.send_time, r.first_token_time, r.end_time) for r in OPEN]
    assert "Dispatch delay" not in render_markdown(model(closed))


def test_no_note_while_the_p99_dispatch_delay_is_within_5_ms():
    on_time = [rec(r.index, r.send_time - 0.003, r.send_time, r.first_token_time, r.end_time)
               for r in OPEN]  # fmt: skip
    assert dispatch_notes(on_time, concurrency=8, time_scale=1.0) == []


def test_a_late_request_is_told_apart_by_whether_every_slot_was_taken():
    # concurrency 1: request 1 is due at 0.1 while request 0 runs until 0.401 (slot taken);
    # request 3 is due at 0.9, after everything ended, and left 30 ms late (the client)
    records = [
        rec(0, 0.0, 0.001, 0.101, 0.401),
        rec(1, 0.1, 0.402, 0.502, 0.802),
        rec(2, 0.8, 0.803, 0.850, 0.870),
        rec(3, 0.9, 0.930, 0.990, 1.000),
    ]
    [note] = dispatch_notes(records, concurrency=1, time_scale=1.0)
    assert note.startswith("the client, not the server, set the pace: p99 dispatch delay")
    assert "2 of 4 requests left more than 5 ms after their scheduled time" in note
    assert "1 of them because every one of the 1 concurrency slots was taken" in note
    assert "and 1 because the client itself was late" in note
    # with two slots request 1 had one free: both late requests are the client's
    [note] = dispatch_notes(records, concurrency=2, time_scale=1.0)
    assert "0 of them because" in note and "and 2 because the client itself" in note
