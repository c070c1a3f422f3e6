"""GPU telemetry in what a run leaves: summary.json read-back, comparison rows, report.html,
and the cluster file's ``telemetry:`` block."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_kimi.config import ConfigError, load_cluster
from pytest_kimi.report.comparison import build_comparison, render_markdown
from pytest_kimi.report.html import render_html
from pytest_kimi.results import catalogue
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.store import RunFolder
from pytest_kimi.results.telemetry_stats import GpuSample, TelemetrySeries, TelemetrySummary

CLUSTERS = Path(__file__).parents[2] / "clusters"
TELEMETRY = TelemetrySummary(62.5, 97.0, 2400.0, 3100.0, 48000.0, 1.5, rounds=9, gpus=16)


def _records() -> list[RequestRecord]:
    out = []
    for i in range(6):
        send, first = 10.0 + i * 0.2, 10.5 + i * 0.2
        chunks = [Chunk(first + k * 0.05, 1) for k in range(4)]
        out.append(RequestRecord(i, f"p{i}", 100, 4, send_time=send, first_token_time=first,
                                 end_time=chunks[-1].time, chunks=chunks, completion_tokens=4,
                                 success=True))  # fmt: skip
    return out


def _series(nodes=("node601", "node602")) -> TelemetrySeries:
    """Origin at perf_counter 9.0 (a second before the first request), time scale 40."""
    samples = [
        GpuSample(t, node, g, util_pct=min(100.0, t), power_w=100.0 + t)
        for t in (0.0, 40.0, 80.0, 120.0)
        for node in nodes
        for g in range(2)
    ]
    return TelemetrySeries(9.0, 40.0, 1.0, tuple(nodes), samples)


def _results() -> list[LayoutResult]:
    sampled = LayoutResult("tp32", "TP32", summarize(a := _records(), time_scale=40.0),
                           records=a, telemetry=TELEMETRY, telemetry_series=_series())  # fmt: skip
    attached = LayoutResult("pp8", "PP8", summarize(b := _records(), time_scale=40.0), records=b)
    return [sampled, attached]


def test_summary_json_carries_the_figures_and_reads_back_exactly(tmp_path):
    folder = RunFolder.create(tmp_path, "run")
    live = _results()
    for result in live:
        folder.write_records(result.name, result.records)
        folder.write_summary(result, "mock", 40.0)
    path = folder.telemetry_path("tp32")
    path.write_text('{"start": {"clock": 9.0, "time_scale": 40.0, "interval_s": 1.0, '
                    '"nodes": ["node601"]}}\n' + GpuSample(0.0, "node601", 0, 5.0).to_json()
                    + "\n{\"t\": 1")  # a line cut short by a killed run  # fmt: skip
    saved = json.loads((folder.path / "tp32" / "summary.json").read_text())
    assert saved["telemetry"]["energy_per_output_token_j"] == 1.5
    back = folder.read_layout("tp32")
    assert back.telemetry == TELEMETRY
    assert back.telemetry_series is not None and len(back.telemetry_series.samples) == 1
    assert folder.read_layout("pp8").telemetry is None
    stored = [folder.read_layout("tp32"), folder.read_layout("pp8")]
    a = build_comparison(live, run_id="r", backend="mock", time_scale=40.0)
    b = build_comparison(stored, run_id="r", backend="mock", time_scale=40.0)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_comparison_has_the_gpu_rows_only_when_a_layout_was_sampled():
    results = _results()
    model = build_comparison(results, run_id="r", backend="mock", time_scale=40.0)
    rows = {row["metric"]: row for row in model["rows"]}
    assert list(rows)[-len(catalogue.TELEMETRY_ROWS) :] == list(catalogue.TELEMETRY_ROWS)
    assert rows["power_mean_w"]["values"] == {"tp32": 2400.0, "pp8": None}
    assert rows["gpu_util_peak"]["values"]["tp32"] == 97.0
    markdown = render_markdown(model)
    assert "| GPU energy per output token (J) | 1.50 | n/a | n/a |" in markdown
    assert "| GPU power mean (W, all GPUs) | 2400 | n/a | n/a |" in markdown
    assert model["layouts"][0]["telemetry"]["gpus"] == 16
    plain = build_comparison(results[1:], run_id="r", backend="mock", time_scale=40.0)
    assert not {row["metric"] for row in plain["rows"]} & set(catalogue.TELEMETRY_ROWS)


def test_gpu_metrics_describe_and_are_no_slo_or_gate():
    for name in catalogue.TELEMETRY_ROWS:
        m = catalogue.metric(name)
        assert not catalogue.sloable(m) and not catalogue.gateable(m), name
    assert catalogue.metric("energy_per_output_token_j").higher_is_better is False


def test_report_html_draws_one_gpu_panel_per_node_under_the_timeline():
    results = _results()
    model = build_comparison(results, run_id="r", backend="mock", time_scale=40.0)
    page = render_html(
        model,
        {r.name: r.records for r in results},
        telemetry={r.name: r.telemetry_series for r in results},
    )
    timeline = page[page.index('<figure id="timeline">') :]
    timeline = timeline[: timeline.index("</figure>")]
    for node in ("node601", "node602"):
        assert f"<!-- {node} -->" in timeline  # matplotlib names each text it draws
    assert "tp32: GPUs per node" in timeline
    assert "per node: GPU utilisation" in timeline
    assert "no GPU telemetry for pp8 (see the notes)" in timeline
    without = render_html(model, {r.name: r.records for r in results})
    assert "node601" not in without


def test_cluster_file_telemetry_block(tmp_path):
    local = load_cluster(CLUSTERS / "local.yaml")
    assert local.telemetry.enabled and 0 < local.telemetry.interval_s < 5
    without = re.sub(r"\ntelemetry:.*\n", "\n", (CLUSTERS / "local.yaml").read_text())
    path = tmp_path / "c.yaml"
    path.write_text(without)
    default = load_cluster(path).telemetry
    assert default.enabled is True and default.interval_s == 5.0
    path.write_text(without + "telemetry: {enabled: false}\n")
    assert load_cluster(path).telemetry.enabled is False
    path.write_text(without + "telemetry: {interval_s: 0}\n")
    with pytest.raises(ConfigError, match=r"telemetry\.interval_s"):
        load_cluster(path)
