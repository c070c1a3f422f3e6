"""report.html: one self-contained file with every plot, parsed back to check."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np

from pytest_kimi.report.comparison import LayoutResult, build_comparison
from pytest_kimi.report.html import render_html
from pytest_kimi.report.plots import PLOT_IDS
from pytest_kimi.report.timelineplot import UNATTRIBUTED, timeline_rows
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.replicacounters import ReplicaCounters


def _records(shift: float, replicas=("r0", "r1")) -> list[RequestRecord]:
    rng = np.random.default_rng(int(shift * 10))
    out = []
    for i in range(12):
        send = i * 0.5
        first = send + 1.0 + shift + rng.random() * 0.2
        chunks = [Chunk(first + k * 0.05, 1) for k in range(6)]
        out.append(RequestRecord(i, f"p{i}", 100, 6, send_time=send, first_token_time=first,
                                 end_time=chunks[-1].time, chunks=chunks, completion_tokens=6,
                                 success=i != 3, error="" if i != 3 else "HTTP 500",
                                 replica=replicas[i % len(replicas)]))  # fmt: skip
    return out


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.svgs = 0
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "svg":
            self.svgs += 1
        for key in ("src", "href"):
            if key in attrs and attrs[key] and not attrs[key].startswith("#"):
                self.external.append(attrs[key])


def test_report_html_is_self_contained_with_every_plot():
    results = [
        LayoutResult("tp32", "TP32", summarize(a := _records(0.0)), records=a),
        LayoutResult("pp8", "PP8", summarize(b := _records(0.5)), records=b),
    ]
    model = build_comparison(results, run_id="run-1", backend="mock", time_scale=40.0)
    page = render_html(model, {r.name: r.records for r in results})
    parser = _Page()
    parser.feed(page)
    assert set(PLOT_IDS) <= set(parser.ids)
    assert parser.svgs >= len(PLOT_IDS)
    assert parser.external == []  # nothing to fetch: one file says it all
    assert "time scale 1:40" in page and "TTFT p95" in page and "pp8 vs tp32" in page
    assert "INCOMPLETE" not in page


def test_report_html_of_an_interrupted_run_says_so_above_the_table():
    records = _records(0.0)
    results = [LayoutResult("tp32", "TP32", None, error="run interrupted after 5 of 12 "
                            "requests finished: KeyboardInterrupt", records=records)]  # fmt: skip
    model = build_comparison(results, run_id="r", backend="mock", time_scale=40.0,
                             stopped_early="interrupted (Ctrl-C or SIGTERM)")  # fmt: skip
    page = render_html(model, {"tp32": records})
    banner = page.split("<table")[0]
    assert "INCOMPLETE RUN" in banner
    assert "session stopped early: interrupted (Ctrl-C or SIGTERM)" in banner
    assert "tp32: run interrupted after 5 of 12 requests finished" in banner


def test_report_html_without_records_still_renders_table_and_cdfs():
    result = LayoutResult("tp32", "TP32", None, error="BringUpError: node603 unreachable")
    model = build_comparison([result], run_id="r", backend="sglang", time_scale=1.0)
    page = render_html(model, {"tp32": []})
    assert "not measured: BringUpError: node603 unreachable" in page
    assert "cdf-ttft" in page


def test_timeline_without_per_request_replica_is_one_row_plus_counter_totals():
    records = _records(0.0, replicas=(None,))
    rows = timeline_rows(records)
    assert [(name, len(rs)) for name, rs in rows] == [(UNATTRIBUTED, 12)]  # no fake split
    assert [name for name, _ in timeline_rows(_records(0.0))] == ["r0", "r1"]
    results = [LayoutResult("tp32", "TP32", summarize(records), records=records)]
    model = build_comparison(results, run_id="r", backend="mock", time_scale=40.0)
    counters = {"tp32": {"replica0": ReplicaCounters("http://a:1", 7, 700, 42),
                         "replica1": ReplicaCounters("http://a:2", 5, 500, 30)}}  # fmt: skip
    page = render_html(model, {"tp32": records}, counters)
    caption = page.split('id="timeline"')[1].split("<figcaption>")[1].split("</figcaption>")[0]
    assert "attribution by counters, not per request" in caption
    assert "tp32: replica0 7 req, replica1 5 req" in caption
    assert "replica0" not in render_html(model, {"tp32": records})  # no counters: no totals
