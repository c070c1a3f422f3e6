"""The A/B comparison model and its Markdown / text renderers.

Hand-made records (time_scale 1, 100 nominal input tokens, 5 output tokens each):

* tp32: two requests sent at 0.0, first token 1.0, end 5.0 -> TTFT 1000 ms, E2E 5000 ms,
  TPOT (5000 - 1000) / 4 = 1000 ms; duration 5 s; output 10 / 5 = 2 tok/s, input 200 / 5 = 40,
  total 42.
* pp8: two requests sent at 0.0, first token 2.0, end 4.0 -> TTFT 2000 ms, E2E 4000 ms,
  TPOT (4000 - 2000) / 4 = 500 ms; duration 4 s; output 10 / 4 = 2.5 tok/s, input 50, total 52.5.

Deltas of pp8 against tp32: duration -20 %, output TPS +25 %, TTFT +100 %, TPOT -50 %, E2E -20 %.
"""

from __future__ import annotations

import json

import pytest

from pytest_kimi.report.comparison import (
    ROWS,
    LayoutResult,
    backend_label,
    build_comparison,
    relative_delta,
    render_markdown,
    render_text,
)
from pytest_kimi.results.metrics import Summary, summarize
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.results.slo import Verdict, evaluate, parse_slo


def make_summary(first: float, end: float) -> Summary:
    recs = [
        RequestRecord(
            index=i,
            prompt_id=f"p{i}",
            nominal_input_tokens=100,
            max_output_tokens=5,
            send_time=0.0,
            first_token_time=first,
            end_time=end,
            completion_tokens=5,
            success=True,
        )
        for i in range(2)
    ]
    return summarize(recs)


ERROR = "bring-up failed: node603 did not answer /health\nTraceback (most recent call last):"


@pytest.fixture
def results() -> list[LayoutResult]:
    tp32 = make_summary(1.0, 5.0)
    pp8 = make_summary(2.0, 4.0)
    return [
        LayoutResult(
            name="tp32",
            label="TP32/PP1/EP4",
            summary=tp32,
            verdicts=[evaluate(parse_slo("ttft_p95", "30s", "cli"), tp32)],
            result_dir="reports/run/tp32",
            notes=["router logged a tokenizer error"],
        ),
        LayoutResult(
            name="pp8",
            label="TP4/PP8/EP4",
            summary=pp8,
            verdicts=[
                evaluate(parse_slo("tpot_mean", "150ms", "c.yaml slo.tpot_mean"), pp8),
                Verdict(parse_slo("itl_p95", "100ms", "cli"), float("nan")),
            ],
        ),
        LayoutResult(name="broken", label="TP8/PP4/EP4", error=ERROR),
    ]


@pytest.fixture
def model(results: list[LayoutResult]) -> dict:
    return build_comparison(results, run_id="20260902-123051-local-dp2", backend="mock",
                            time_scale=40.0)  # fmt: skip


def row(model: dict, metric: str) -> dict:
    (found,) = [r for r in model["rows"] if r["metric"] == metric]
    return found


def test_relative_delta() -> None:
    assert relative_delta(3.0, 2.0) == 0.5
    assert relative_delta(1.0, 4.0) == -0.75
    assert relative_delta(2.0, 2.0) == 0.0
    assert relative_delta(5.0, 0.0) is None
    assert relative_delta(None, 1.0) is None
    assert relative_delta(1.0, None) is None


def test_model_header(model: dict) -> None:
    assert model["run_id"] == "20260902-123051-local-dp2"
    assert model["backend"] == "mock"
    assert model["time_scale"] == 40.0
    assert model["reference"] == "tp32"
    assert [r["metric"] for r in model["rows"]] == [m for m, _, _ in ROWS]
    assert [layout["name"] for layout in model["layouts"]] == ["tp32", "pp8", "broken"]


@pytest.mark.parametrize(
    ("metric", "tp32", "pp8", "delta"),
    [
        ("completed", 2.0, 2.0, 0.0),
        ("duration", 5.0, 4.0, -0.2),
        ("input_throughput", 40.0, 50.0, 0.25),
        ("output_throughput", 2.0, 2.5, 0.25),
        ("total_throughput", 42.0, 52.5, 0.25),
        ("ttft_mean", 1000.0, 2000.0, 1.0),
        ("ttft_median", 1000.0, 2000.0, 1.0),
        ("ttft_p95", 1000.0, 2000.0, 1.0),
        ("ttft_p99", 1000.0, 2000.0, 1.0),
        ("tpot_mean", 1000.0, 500.0, -0.5),
        ("tpot_median", 1000.0, 500.0, -0.5),
        ("tpot_p95", 1000.0, 500.0, -0.5),
        ("e2e_mean", 5000.0, 4000.0, -0.2),
        ("e2e_p95", 5000.0, 4000.0, -0.2),
        ("peak_concurrency", 2.0, 2.0, 0.0),
    ],
)
def test_values_and_deltas(model: dict, metric: str, tp32: float, pp8: float, delta: float) -> None:
    r = row(model, metric)
    assert r["values"]["tp32"] == pytest.approx(tp32)
    assert r["values"]["pp8"] == pytest.approx(pp8)
    assert r["values"]["broken"] is None
    # (v - ref) / ref, and only for the non-reference layouts
    assert set(r["delta"]) == {"pp8", "broken"}
    assert r["delta"]["pp8"] == pytest.approx(delta)
    assert r["delta"]["broken"] is None


def test_zero_reference_has_no_delta(model: dict) -> None:
    r = row(model, "failed")
    assert r["values"] == {"tp32": 0.0, "pp8": 0.0, "broken": None}
    assert r["delta"] == {"pp8": None, "broken": None}


def test_layouts_section(model: dict, results: list[LayoutResult]) -> None:
    tp32, pp8, broken = model["layouts"]
    assert tp32["label"] == "TP32/PP1/EP4"
    assert tp32["result_dir"] == "reports/run/tp32"
    assert tp32["notes"] == ["router logged a tokenizer error"]
    assert tp32["summary"] == results[0].summary.to_dict()
    assert tp32["slo"] == [
        {
            "name": "ttft_p95",
            "limit": 30000.0,
            "unit": "ms",
            "upper_bound": True,
            "measured": pytest.approx(1000.0),
            "passed": True,
            "outcome": "passed",
            "source": "cli",
        }
    ]
    assert [s["passed"] for s in pp8["slo"]] == [False, False]
    assert pp8["slo"][0]["measured"] == pytest.approx(500.0)
    assert pp8["slo"][1]["measured"] is None  # NaN never reaches the model
    assert broken["summary"] is None
    assert broken["error"] == ERROR
    assert broken["slo"] == []


def test_model_is_strict_json(model: dict) -> None:
    text = json.dumps(model, allow_nan=False)
    assert json.loads(text)["reference"] == "tp32"


def test_empty_results_rejected() -> None:
    with pytest.raises(ValueError, match="no layout results"):
        build_comparison([], run_id="r", backend="mock", time_scale=1.0)


def test_single_layout_has_no_delta_columns(results: list[LayoutResult]) -> None:
    model = build_comparison(results[:1], run_id="r", backend="sglang", time_scale=1.0)
    assert all(r["delta"] == {} for r in model["rows"])
    lines = render_markdown(model).splitlines()
    assert "| metric | tp32 (TP32/PP1/EP4) |" in lines
    assert "|---|---:|" in lines


# ----------------------------------------------------------------------------- backend label


def test_backend_label_mock(model: dict) -> None:
    assert backend_label(model) == "mock backend, time scale 1:40 (figures in cluster time)"


def test_backend_label_fractional_scale() -> None:
    model = {"backend": "mock", "time_scale": 2.5}
    assert "time scale 1:2.5" in backend_label(model)


def test_backend_label_real() -> None:
    label = backend_label({"backend": "sglang", "time_scale": 1.0})
    assert label == "sglang backend"
    assert "time scale" not in label


# ----------------------------------------------------------------------------- markdown


def table_lines(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|")]


def test_markdown_header_and_table(model: dict) -> None:
    md = render_markdown(model)
    lines = md.splitlines()
    assert lines[0] == "# Layout comparison: 20260902-123051-local-dp2"
    assert "Backend: mock backend, time scale 1:40 (figures in cluster time)." in md
    assert "Reference layout: `tp32`" in md
    table = table_lines(md)
    assert table[0] == (
        "| metric | tp32 (TP32/PP1/EP4) | pp8 (TP4/PP8/EP4) | broken (TP8/PP4/EP4) "
        "| pp8 vs tp32 | broken vs tp32 |"
    )
    assert table[1] == "|---|---:|---:|---:|---:|---:|"
    assert len(table) == 2 + len(ROWS)
    # Every line of the table has the same number of cells.
    assert {line.count("|") for line in table} == {7}
    assert md.endswith("\n")


def test_markdown_two_layouts_one_delta_column(results: list[LayoutResult]) -> None:
    model = build_comparison(results[:2], run_id="r", backend="mock", time_scale=40.0)
    table = table_lines(render_markdown(model))
    assert table[0] == "| metric | tp32 (TP32/PP1/EP4) | pp8 (TP4/PP8/EP4) | pp8 vs tp32 |"
    assert table[1] == "|---|---:|---:|---:|"


@pytest.mark.parametrize(
    "line",
    [
        "| Successful requests | 2 | 2 | n/a | +0.00% | n/a |",
        "| Failed requests | 0 | 0 | n/a | n/a | n/a |",
        "| Benchmark duration | 5.00 s | 4.00 s | n/a | -20.00% | n/a |",
        "| Input TPS | 40.00 | 50.00 | n/a | +25.00% | n/a |",
        "| Output TPS | 2.00 | 2.50 | n/a | +25.00% | n/a |",
        "| Total TPS | 42.00 | 52.50 | n/a | +25.00% | n/a |",
        "| TTFT mean | 1.00 s | 2.00 s | n/a | +100.00% | n/a |",
        "| TPOT mean | 1.00 s | 500.00 ms | n/a | -50.00% | n/a |",
        "| E2E p95 | 5.00 s | 4.00 s | n/a | -20.00% | n/a |",
        "| Peak concurrent requests (exact) | 2 | 2 | n/a | +0.00% | n/a |",
    ],
)
def test_markdown_rows(model: dict, line: str) -> None:
    assert line in table_lines(render_markdown(model))


def test_markdown_slo_section(model: dict) -> None:
    md = render_markdown(model)
    slo_part = md.split("## SLO verdicts\n", 1)[1].split("## Notes", 1)[0]
    assert "- **tp32** ttft_p95 <= 30.00 s: PASS (measured 1.00 s)" in slo_part
    assert "- **pp8** tpot_mean <= 150.0 ms: FAIL (measured 500.0 ms)" in slo_part
    assert "- **pp8** itl_p95 <= 100.0 ms: FAIL (measured n/a)" in slo_part
    # The failed layout shows the first line of its error, not the traceback.
    assert "- **broken**: not measured: bring-up failed: node603 did not answer /health" in slo_part
    assert "Traceback" not in md


def test_markdown_notes(model: dict) -> None:
    md = render_markdown(model)
    assert "## Notes\n\n- **tp32**: router logged a tokenizer error\n" in md


def test_markdown_without_notes(results: list[LayoutResult]) -> None:
    results[0].notes = []
    model = build_comparison(results, run_id="r", backend="mock", time_scale=40.0)
    assert "## Notes" not in render_markdown(model)


# ----------------------------------------------------------------------------- incomplete


def test_all_layouts_measured_is_complete_and_has_no_banner(results: list[LayoutResult]) -> None:
    model = build_comparison(results[:2], run_id="r", backend="mock", time_scale=40.0)
    assert model["complete"] is True and model["incomplete"] == []
    assert "INCOMPLETE" not in render_markdown(model)
    assert "INCOMPLETE" not in render_text(model)


def test_a_layout_not_measured_marks_the_report_incomplete(model: dict) -> None:
    assert model["complete"] is False
    assert model["incomplete"] == ["broken: bring-up failed: node603 did not answer /health"]
    md = render_markdown(model)
    banner = md.split("| metric")[0]  # above the table, where nobody misses it
    assert "**INCOMPLETE RUN**" in banner
    assert "- broken: bring-up failed: node603 did not answer /health" in banner


def test_a_session_stopped_early_names_why_first(results: list[LayoutResult]) -> None:
    model = build_comparison(results, run_id="r", backend="mock", time_scale=40.0,
                             stopped_early="interrupted (Ctrl-C or SIGTERM)")  # fmt: skip
    assert model["incomplete"] == [
        "session stopped early: interrupted (Ctrl-C or SIGTERM)",
        "broken: bring-up failed: node603 did not answer /health",
    ]


def test_stopping_early_after_every_layout_was_measured_is_still_complete(
    results: list[LayoutResult],
) -> None:
    # e.g. -x stopped at a failing SLO test of the last layout: every figure is there
    model = build_comparison(results[:2], run_id="r", backend="mock", time_scale=40.0,
                             stopped_early="stopping after 1 failures")  # fmt: skip
    assert model["complete"] is True and model["incomplete"] == []


# ----------------------------------------------------------------------------- text


def test_render_text_aligned(model: dict) -> None:
    lines = render_text(model).splitlines()
    assert lines[0] == "INCOMPLETE RUN: broken: bring-up failed: node603 did not answer /health"
    assert lines[1] == "mock backend, time scale 1:40 (figures in cluster time); reference tp32"
    table = lines[2:]
    assert len(table) == 1 + len(ROWS)
    assert table[0].startswith("metric ")
    # Left-justified first column, right-justified others: all lines equally long, and every
    # column ends at the same offset as its header cell.
    assert len({len(line) for line in table}) == 1
    header_cells = [
        "tp32 (TP32/PP1/EP4)",
        "pp8 (TP4/PP8/EP4)",
        "broken (TP8/PP4/EP4)",
        "pp8 vs tp32",
        "broken vs tp32",
    ]
    ends, start = [], 0
    for cell in header_cells:
        start = table[0].index(cell, start) + len(cell)
        ends.append(start)
    assert ends[-1] == len(table[0])
    for line in table[1:]:
        for end in ends:
            assert line[end - 1] != " ", (line, end)
            assert end == len(line) or line[end : end + 2] == "  ", (line, end)
    (output,) = [line for line in table if line.startswith("Output TPS")]
    assert output.split() == ["Output", "TPS", "2.00", "2.50", "n/a", "+25.00%", "n/a"]


def test_render_text_columns_separated_by_two_spaces(results: list[LayoutResult]) -> None:
    model = build_comparison(results[:2], run_id="r", backend="mock", time_scale=40.0)
    lines = render_text(model).splitlines()[1:]
    header = lines[0]
    assert header.endswith("  tp32 (TP32/PP1/EP4)  pp8 (TP4/PP8/EP4)  pp8 vs tp32")
    width = len("metric".ljust(max(len(label) for _, label, _ in ROWS)))
    assert header.startswith("metric".ljust(width) + "  ")
