"""What the report shows for speculative and disaggregated layouts: the accept length beside
TPOT, overall and per SPEED-Bench category; and where a PD layout's TTFT goes, by SGLang's
per-stage latencies, with KV transfer throughput where a server reports it."""

from __future__ import annotations

import json

from pytest_kimi.report.comparison import LayoutResult, build_comparison, render_markdown
from pytest_kimi.report.html import render_html
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.pdstages import (
    KV_SPEED,
    StageTimes,
    kv_gauges,
    stage_times,
    stage_totals,
    transfers,
    ttft_tables,
)
from pytest_kimi.results.records import Chunk, RequestRecord


def _record(i: int, category: str, tpot_s: float, verify: int | None) -> RequestRecord:
    """10 tokens: first at 1.0 s, last at 1.0 + 9 x tpot."""
    end = 1.0 + 9 * tpot_s
    return RequestRecord(
        index=i, prompt_id=f"p{i}", nominal_input_tokens=100, max_output_tokens=10,
        send_time=0.0, first_token_time=1.0, end_time=end,
        chunks=[Chunk(1.0, 1), Chunk(end, 9)], completion_tokens=10, success=True,
        category=category, spec_verify_ct=verify,
        spec_accept_length=10 / verify if verify else None,
    )  # fmt: skip


def _results() -> list[LayoutResult]:
    plain = [_record(0, "low_entropy", 0.08, None), _record(1, "high_entropy", 0.08, None)]
    spec = [_record(0, "low_entropy", 0.03, 3), _record(1, "high_entropy", 0.06, 5)]
    return [LayoutResult("tp32", "TP32/PP1/EP4", summary=summarize(plain), records=plain),
            LayoutResult("tp32-eagle", "TP32/PP1/EP4", summary=summarize(spec),
                         records=spec)]  # fmt: skip


def test_the_accept_length_sits_beside_tpot_and_per_category():
    model = build_comparison(_results(), run_id="r", backend="mock", time_scale=1.0)
    names = [row["metric"] for row in model["rows"]]
    assert names.index("spec_accept_length") == names.index("tpot_p95") + 1
    (row,) = [r for r in model["rows"] if r["metric"] == "spec_accept_length"]
    assert row["values"] == {"tp32": None, "tp32-eagle": 20 / 8}
    markdown = render_markdown(model)
    table = markdown[markdown.index("## Per SPEED-Bench category"):].splitlines()
    assert "| high_entropy | tp32 | 1 | 1.00 s | 80.0 ms | 80.0 ms | - |" in table
    assert "| high_entropy | tp32-eagle | 1 | 1.00 s | 60.0 ms | 60.0 ms | 2.00 |" in table
    assert "| low_entropy | tp32-eagle | 1 | 1.00 s | 30.0 ms | 30.0 ms | 3.33 |" in table
    page = render_html(model, {r.name: r.records for r in _results()})
    assert "Per SPEED-Bench category" in page and "<td>low_entropy</td>" in page


def test_without_speculation_or_categories_nothing_is_added():
    plain = [_record(0, "mixed", 0.08, None)]
    result = LayoutResult("tp32", "TP32", summary=summarize(plain), records=plain)
    model = build_comparison([result], run_id="r", backend="mock", time_scale=1.0)
    assert "spec_accept_length" not in [row["metric"] for row in model["rows"]]
    assert "Per SPEED-Bench category" not in render_markdown(model)
    assert "where TTFT goes" not in render_markdown(model)


def _metrics(stages: dict[str, tuple[float, float]], speed: float = 0.0) -> str:
    name = "sglang:per_stage_req_latency_seconds"
    lines = [f"# TYPE {name} histogram"]
    for stage, (total, count) in stages.items():
        tag = f'engine_type="prefill",stage="{stage}"'
        lines += [f'{name}_bucket{{{tag},le="+Inf"}} {count}', f"{name}_sum{{{tag}}} {total}",
                  f"{name}_count{{{tag}}} {count}"]  # fmt: skip
    lines += [f"# TYPE {KV_SPEED} gauge", f'{KV_SPEED}{{engine_type="prefill"}} {speed}']
    return "\n".join(lines) + "\n"


def test_stage_means_come_from_the_histograms_over_the_run():
    before = {"prefill0": stage_totals(_metrics({"prefill_forward": (1.0, 1)})),
              "decode0": stage_totals(_metrics({"decode_waiting": (0.1, 1)}))}  # fmt: skip
    after_text = {
        "prefill0": _metrics({"prefill_forward": (5.0, 5), "prefill_bootstrap": (2.0, 4),
                              "prefill_waiting": (9.0, 12),
                              "prefill_transfer_kv_cache": (1.2, 4)}),
        "decode0": _metrics({"decode_waiting": (0.5, 5), "decode_bootstrap": (0.0, 4)}),
    }  # fmt: skip
    after = {name: stage_totals(text) for name, text in after_text.items()}
    kv = {name: kv_gauges(text) for name, text in after_text.items()}
    times = stage_times(before, after, kv)
    assert times is not None and (times.prefill_requests, times.decode_requests) == (4, 4)
    # per request on its side: chunks' waits add up; the warm-up before the run is left out
    assert times.seconds["prefill_waiting"] == 9.0 / 4
    assert times.seconds["prefill_forward"] == 1.0 and times.seconds["decode_waiting"] == 0.1
    assert times.kv_speed_gb_s is None and "never sets it" in times.notes[0]
    split = dict(times.ttft_split(ttft_mean_ms=4000.0))
    assert split["prefill: queued (and earlier chunks)"] == 2250.0
    assert split["the rest: router, HTTP, client"] == 4000.0 - (500 + 2250 + 1000 + 300 + 100)
    assert StageTimes.from_dict(json.loads(json.dumps(times.to_dict()))) == times
    assert stage_times(before, {"prefill0": {}, "decode0": {}}, {}) is None  # not PD


def test_a_server_that_reports_kv_throughput_is_shown():
    before = {"prefill0": {}}
    text = _metrics({"prefill_forward": (1.0, 2)}, speed=12.5)
    times = stage_times(before, {"prefill0": stage_totals(text)}, {"prefill0": kv_gauges(text)})
    assert times is not None and times.kv_speed_gb_s == 12.5 and times.notes == ()
    section = {"layouts": [{"name": "pd", "pd_stages": times.to_dict(),
                            "summary": {"mean_ttft_ms": 2000.0}}]}  # fmt: skip
    (table,) = ttft_tables(section)
    assert table["rows"][0] == ["prefill: the last chunk's forward", "500.0 ms", "25%"]
    assert table["rows"][-1] == ["TTFT (mean)", "2.00 s", "100%"]
    assert table["kv"].startswith("KV transfer throughput: 12.50 GB/s")


def test_the_transfer_runs_until_the_kv_landed_on_the_decode_side():
    """``decode_transferred`` spans the prefill's queue, its forward and the transfer to the
    landing: what is left of it after the prefill's parts is the transfer's tail, which the
    prefill's own ``prefill_transfer_kv_cache`` (done sending) may understate."""
    times = StageTimes({"prefill_waiting": 2.0, "prefill_forward": 1.0,
                        "prefill_transfer_kv_cache": 0.2, "decode_transferred": 3.5,
                        "decode_waiting": 0.1}, 4, 4)  # fmt: skip
    assert times.transfer_tail() == 0.5
    split = dict(times.ttft_split(3700.0))
    assert split["KV transfer left after the last chunk, until it landed"] == 500.0
    assert split["the rest: router, HTTP, client"] == 3700.0 - (2000 + 1000 + 500 + 100)


def test_a_pd_layout_is_measured_against_its_sides_shapes():
    """The seed's proposal: TTFT p95 near PP8's (the prefill side's shape), TPOT near TP32's
    (the decode side's); the report says by how much."""
    from pytest_kimi.results.pdstages import against_sides

    def lay(name: str, label: str, ttft_p95: float, tpot: float) -> dict:
        return {"name": name, "label": label,
                "summary": {"p95_ttft_ms": ttft_p95, "mean_tpot_ms": tpot}}  # fmt: skip

    pd = lay("pd", "prefill TP4/PP8/EP4 x1 + decode TP32/PP1/EP4 x1", 11500.0, 48.0)
    section = {"layouts": [lay("tp32", "TP32/PP1/EP4", 19630.0, 72.0),
                           lay("pp8", "TP4/PP8/EP4", 10000.0, 130.0), pd]}  # fmt: skip
    text = against_sides(section, pd)
    assert text == ("TTFT p95 11.50 s against pp8's 10.00 s (+15.0%; TP4/PP8/EP4, the prefill "
                    "side's shape); TPOT mean 48.0 ms against tp32's 72.0 ms (-33.3%; "
                    "TP32/PP1/EP4, the decode side's shape)")  # fmt: skip
    assert against_sides({"layouts": [pd]}, pd) == ""  # neither shape in the run


def test_a_restarted_server_and_missing_prefill_figures_give_no_false_split():
    before = {"prefill0": {"prefill_forward": (9.0, 9)}, "decode0": {"decode_waiting": (1.0, 9)}}
    after = {"prefill0": {"prefill_forward": (2.0, 2)},  # restarted: its counts went back
             "decode0": {"decode_waiting": (1.5, 14), "decode_transferred": (20.0, 5)}}  # fmt: skip
    times = stage_times(before, after, {})
    assert times is not None and "prefill_forward" not in times.seconds
    assert times.seconds["decode_waiting"] == 0.1
    assert times.transfer_tail() is None  # no prefill side to subtract: no tail claimed


def test_a_rest_of_nothing_reads_as_zero_not_minus_zero():
    """On the mock's one clock the router and HTTP take no cluster time: the sum of the
    stages is TTFT up to float rounding, which must not print as -0.0 ms / -0%."""
    times = StageTimes({"prefill_forward": 1.0, "decode_waiting": 0.1 + 0.2}, 1, 1)
    section = {"layouts": [{"name": "pd", "pd_stages": times.to_dict(),
                            "summary": {"mean_ttft_ms": 1299.9999999999998}}]}  # fmt: skip
    (table,) = ttft_tables(section)
    rest = next(row for row in table["rows"] if row[0].startswith("the rest"))
    assert rest[1:] == ["0.0 ms", "0%"]


def _metrics_0_5_10(stages: dict[str, tuple[float, float]], queue: tuple[float, float],
                    kv: dict[str, tuple[float, float]]) -> str:  # fmt: skip
    """A 0.5.10+ server: per-stage without the queue stages, the queue in queue_time_seconds,
    the KV transfers in histograms (``_sum`` and ``_count`` of each)."""
    lines = _metrics(stages).splitlines()[:-2]  # no 0.5.9 gauge
    hists = {"sglang:queue_time_seconds": queue, **{f"sglang:kv_transfer_{k}": v
                                                     for k, v in kv.items()}}  # fmt: skip
    for name, (total, count) in hists.items():
        tag = 'engine_type="prefill"'
        lines += [f"# TYPE {name} histogram", f'{name}_bucket{{{tag},le="+Inf"}} {count}',
                  f"{name}_sum{{{tag}}} {total}", f"{name}_count{{{tag}}} {count}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_a_later_release_splits_by_its_queue_histogram_and_reports_its_transfers():
    """0.5.10 and later: the prefill's queue from sglang:queue_time_seconds (a decode
    server's own queue time is not the prefill's), the forward over every chunk, the KV
    transfers from the histograms' growth over the run."""
    no_kv = {"latency_ms": (0.0, 0), "total_mb": (0.0, 0), "speed_gb_s": (0.0, 0)}
    before_text = {
        "prefill0": _metrics_0_5_10({"prefill_forward": (1.0, 1)}, (0.5, 1), no_kv),
        "decode0": _metrics_0_5_10({"decode_waiting": (0.1, 1)}, (0.1, 1), no_kv),
    }
    kv = {"latency_ms": (400.0, 4), "total_mb": (4096.0, 4), "speed_gb_s": (50.0, 4)}
    after_text = {
        "prefill0": _metrics_0_5_10({"prefill_forward": (9.0, 5), "prefill_bootstrap": (0.4, 4),
                                     "chunked_prefill": (3.0, 4),
                                     "prefill_transfer_kv_cache": (0.4, 4)}, (4.5, 5), kv),
        "decode0": _metrics_0_5_10({"decode_waiting": (0.5, 5)}, (99.0, 5), no_kv),
    }  # fmt: skip
    before = {n: stage_totals(t) for n, t in before_text.items()}
    after = {n: stage_totals(t) for n, t in after_text.items()}
    assert "prefill_queue" in after["prefill0"] and "prefill_queue" not in after["decode0"]
    times = stage_times(before, after, {n: kv_gauges(t) for n, t in after_text.items()},
                        {n: kv_gauges(t) for n, t in before_text.items()})  # fmt: skip
    assert times is not None and times.prefill_requests == 4
    assert times.seconds["prefill_queue"] == 1.0 and times.seconds["prefill_forward"] == 2.0
    moved = times.kv_transfers
    assert moved is not None and (moved.count, moved.mean_mb, moved.mean_latency_ms) == (
        4, 1024.0, 100.0)
    assert moved.gb_s == 4096 / 1024 / 0.4 and times.kv_speed_gb_s == moved.gb_s
    assert times.notes == ()  # the histograms are read: nothing "not reported"
    split = dict(times.ttft_split(ttft_mean_ms=5000.0))
    assert split["prefill: queued before its first chunk"] == 1000.0
    assert split["prefill: its forward, every chunk"] == 2000.0
    assert "prefill: queued (and earlier chunks)" not in split
    assert StageTimes.from_dict(json.loads(json.dumps(times.to_dict()))) == times
    section = {"layouts": [{"name": "pd", "pd_stages": times.to_dict(),
                            "summary": {"mean_ttft_ms": 5000.0}}]}  # fmt: skip
    (table,) = ttft_tables(section)
    assert table["kv"].startswith("KV transfer: 4 transfers over the measured run, 10.00 GB/s")
    # a server read only after the run (its lifetime is not the run's), or restarted: left out
    after_kv = {n: kv_gauges(t) for n, t in after_text.items()}
    assert transfers({"prefill0": None}, after_kv) is None
    restarted = {"prefill0": {"sglang:kv_transfer_latency_ms_count": 9.0}}
    assert transfers(restarted, after_kv) is None
