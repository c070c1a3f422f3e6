"""One vocabulary of metrics: SLOs, the gate, the table, JUnit and summary.json agree on it."""

from __future__ import annotations

import math

import pytest

from pytest_kimi.judge import baseline
from pytest_kimi.report.comparison import ROWS
from pytest_kimi.results import baselinefile, catalogue
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.slo import SloError, parse_slo


def _records(n: int = 8) -> list[RequestRecord]:
    out = []
    for i in range(n):
        first = i + 0.5 + 0.01 * i
        chunks = [Chunk(first + k * 0.02, 1) for k in range(6)]
        out.append(RequestRecord(i, f"p{i}", 100, 6, send_time=float(i), first_token_time=first,
                                 end_time=chunks[-1].time, chunks=chunks, completion_tokens=6,
                                 success=True))  # fmt: skip
    return out


@pytest.mark.parametrize("name", ["ttft_p95", "tpot_mean", "e2e_median", "itl_p99"])
def test_latency_names_parse_with_their_bench_serving_key(name: str) -> None:
    m = catalogue.metric(name)
    assert m.unit == "ms" and m.upper_bound and not m.higher_is_better
    prefix, stat = name.split("_")
    infix = "e2e_latency" if prefix == "e2e" else prefix
    assert m.bench_key == f"{stat}_{infix}_ms"


@pytest.mark.parametrize("name", ["ttft_p0", "ttft_p101", "ttft_avg", "latency", "tpot"])
def test_bad_names_are_rejected(name: str) -> None:
    with pytest.raises(catalogue.UnknownMetric):
        catalogue.metric(name)


def test_slo_direction_is_the_catalogues() -> None:
    for name, m in catalogue.AGGREGATES.items():
        if not catalogue.sloable(m):
            with pytest.raises(SloError):
                parse_slo(name, "1", "test")
            continue
        assert parse_slo(name, "0.5", "test").upper is m.upper_bound
    assert parse_slo("ttft_p95", "2s", "test").upper is True


def test_gate_direction_is_the_catalogues() -> None:
    # a 10% rise is worse for a latency and better for a throughput, by the same table
    for name in ("ttft_p95", "output_throughput", "goodput", "success_rate", "completed"):
        j = baseline.Judgement("x", name, baseline=100.0, current=110.0, threshold=0.05)
        worse = not catalogue.metric(name).higher_is_better
        assert (j.change > 0) is worse, name


def test_gate_accepts_exactly_the_gateable_metrics() -> None:
    for name, m in catalogue.AGGREGATES.items():
        if catalogue.gateable(m):
            assert baselinefile.parse_thresholds(f"{name}:5%", "t") == {name: 0.05}
        else:
            with pytest.raises(baselinefile.BaselineError):
                baselinefile.parse_thresholds(f"{name}:5%", "t")


def test_comparison_rows_and_defaults_are_catalogue_metrics() -> None:
    assert [name for name, _, _ in ROWS] == list(catalogue.COMPARISON_ROWS)
    for name, label, unit in ROWS:
        m = catalogue.metric(name)
        assert (label, unit) == (m.label, m.unit)
    for name in (*catalogue.BASELINE_METRICS, *catalogue.DEFAULT_THRESHOLDS):
        assert catalogue.gateable(catalogue.metric(name)), name


def test_figures_use_catalogue_names_and_match_summary_json_keys() -> None:
    summary = summarize(_records(), time_scale=1.0, goodput_limits_ms={"ttft": 1000.0})
    figures = summary.figures()
    stored = summary.to_dict()
    assert figures["completed"] == 8 and isinstance(figures["completed"], int)
    for name, value in figures.items():
        m = catalogue.metric(name)  # every figure is a catalogue name
        if m.bench_key is not None and m.bench_key in stored:
            assert math.isclose(stored[m.bench_key], value), name
    assert not [name for name in figures if name.endswith("_ms")]


def test_ttfat_and_the_reasoning_totals_are_catalogue_metrics() -> None:
    m = catalogue.metric("ttfat_p95")
    assert (m.prefix, m.bench_key, m.unit, m.per_request) == ("ttfat", "p95_ttfat_ms", "ms", True)
    assert catalogue.gateable(m) and catalogue.sloable(m) and m.upper_bound
    for name in ("total_reasoning_tokens", "total_answer_tokens"):
        agg = catalogue.metric(name)
        assert agg.unit == "count" and not catalogue.sloable(agg) and agg.bench_key == name
    assert "ttfat_" in catalogue.known_names()


def _reasoning_records(reasoning: int) -> list[RequestRecord]:
    out = _records()
    for r in out:
        r.reasoning_tokens = reasoning
        r.first_answer_time = r.chunks[reasoning].time
    return out


def test_comparison_shows_reasoning_rows_only_when_a_layout_reasoned() -> None:
    from pytest_kimi.report.comparison import build_comparison
    from pytest_kimi.results.layout import LayoutResult

    def model(reasoning: int) -> list[str]:
        results = [
            LayoutResult(name, name, summarize(recs), [], records=recs)
            for name, recs in (("a", _records()), ("b", _reasoning_records(reasoning)))
        ]
        return [row["metric"] for row in build_comparison(
            results, run_id="r", backend="mock", time_scale=1.0)["rows"]]  # fmt: skip

    assert model(0) == list(catalogue.COMPARISON_ROWS)
    rows = model(2)
    assert [n for n in rows if n not in catalogue.REASONING_ROWS] == list(catalogue.COMPARISON_ROWS)
    start = rows.index(catalogue.REASONING_ROWS[0])
    assert rows[start - 1] == "ttft_p99"
    assert rows[start : start + len(catalogue.REASONING_ROWS)] == list(catalogue.REASONING_ROWS)
