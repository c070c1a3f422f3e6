"""SLO specs and verdicts, with summaries built from hand-made records.

The records in :func:`records` give (time_scale 1):

* r0: sent 0.0, first token 1.0, end 3.0, chunks of 1+2+2 tokens -> TTFT 1000 ms, E2E 3000 ms,
  TPOT (3000 - 1000) / 4 = 500 ms
* r1: sent 1.0, first token 1.5, end 2.5, chunks of 1+1+1 tokens -> TTFT 500 ms, E2E 1500 ms,
  TPOT (1500 - 500) / 2 = 500 ms
* r2: sent 0.5, failed at 1.0

so completed 2, failed 1, success rate 2/3, duration 3 s, output 8 tokens -> 8/3 tok/s,
TTFT p95 = 500 + 0.95 * 500 = 975 ms (numpy linear interpolation), TTFT mean 750 ms.
"""

from __future__ import annotations

import math

import pytest

from pytest_kimi.results.metrics import Summary, summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.slo import (
    Slo,
    SloError,
    Verdict,
    evaluate,
    format_value,
    from_mapping,
    merge,
    parse_assignment,
    parse_slo,
)


def records() -> list[RequestRecord]:
    return [
        RequestRecord(
            index=0,
            prompt_id="a",
            nominal_input_tokens=100,
            max_output_tokens=8,
            send_time=0.0,
            first_token_time=1.0,
            end_time=3.0,
            chunks=[Chunk(1.0, 1), Chunk(1.5, 2), Chunk(3.0, 2)],
            success=True,
        ),
        RequestRecord(
            index=1,
            prompt_id="b",
            nominal_input_tokens=100,
            max_output_tokens=8,
            send_time=1.0,
            first_token_time=1.5,
            end_time=2.5,
            chunks=[Chunk(1.5, 1), Chunk(2.0, 1), Chunk(2.5, 1)],
            success=True,
        ),
        RequestRecord(
            index=2,
            prompt_id="c",
            nominal_input_tokens=100,
            max_output_tokens=8,
            send_time=0.5,
            end_time=1.0,
            success=False,
            error="HTTP 500",
        ),
    ]


@pytest.fixture
def summary() -> Summary:
    return summarize(records())


def test_fixture_summary_is_as_computed_by_hand(summary: Summary) -> None:
    assert summary.completed == 2 and summary.failed == 1
    assert summary.duration_s == pytest.approx(3.0)
    assert summary.metric("ttft_p95") == pytest.approx(975.0)
    assert summary.metric("ttft_mean") == pytest.approx(750.0)
    assert summary.metric("tpot_p95") == pytest.approx(500.0)
    assert summary.metric("output_throughput") == pytest.approx(8 / 3)
    assert summary.metric("success_rate") == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("25s", 25000.0),
        ("150ms", 150.0),
        ("1.5min", 90000.0),
        ("200", 200.0),
        (200, 200.0),
        (12.5, 12.5),
        (" 25 s ", 25000.0),
        ("0.5s", 500.0),
        (".25s", 250.0),
        ("1e3ms", 1000.0),
        ("2min", 120000.0),
    ],
)
def test_parse_duration(value: str | float, ms: float) -> None:
    slo = parse_slo("ttft_p95", value, "cli")
    assert slo == Slo("ttft_p95", ms, True, "ms", "cli")


@pytest.mark.parametrize(
    "name",
    ["ttft_mean", "tpot_median", "itl_max", "e2e_min", "ttft_std", "tpot_p99", "e2e_p99.9"],
)
def test_latency_metric_names(name: str) -> None:
    slo = parse_slo(name, "1s", "cli")
    assert slo.upper and slo.unit == "ms" and slo.limit == 1000.0


def test_name_is_stripped() -> None:
    assert parse_slo("  tpot_mean ", "150ms", "x").name == "tpot_mean"


@pytest.mark.parametrize(
    ("name", "value", "limit", "unit"),
    [
        ("success_rate", "0.99", 0.99, ""),
        ("output_throughput", "1000", 1000.0, "tok/s"),
        ("input_throughput", "2.5e4", 25000.0, "tok/s"),
        ("total_throughput", 300, 300.0, "tok/s"),
        ("request_throughput", "0.5", 0.5, "req/s"),
        ("completed", "40", 40.0, ""),
    ],
)
def test_lower_bound_metrics(name: str, value: str, limit: float, unit: str) -> None:
    slo = parse_slo(name, value, "ini")
    assert slo == Slo(name, limit, False, unit, "ini")


@pytest.mark.parametrize("name", ["latency", "ttft_p95x", "ttft", "tpot_avg"])
def test_unknown_metric_lists_known_ones(name: str) -> None:
    with pytest.raises(SloError) as info:
        parse_slo(name, "1s", "--slo")
    msg = str(info.value)
    assert msg.startswith("--slo: unknown SLO metric ")
    assert repr(name) in msg
    assert "known: " in msg
    for known in ("ttft_", "tpot_", "e2e_", "success_rate", "output_throughput"):
        assert known in msg


@pytest.mark.parametrize("value", ["25 seconds", "fast", "-5ms", "25h", "", "1.2.3s", "s"])
def test_malformed_duration(value: str) -> None:
    with pytest.raises(SloError) as info:
        parse_slo("ttft_p95", value, "clusters/local.yaml slo.ttft_p95")
    msg = str(info.value)
    assert msg.startswith("clusters/local.yaml slo.ttft_p95: SLO ttft_p95=")
    assert repr(value.strip()) in msg
    assert "expected a duration like 25s or 150ms" in msg


@pytest.mark.parametrize("value", ["99%", "high", "1s"])
def test_malformed_number(value: str) -> None:
    with pytest.raises(SloError) as info:
        parse_slo("success_rate", value, "pytest.ini")
    msg = str(info.value)
    assert msg.startswith(f"pytest.ini: SLO success_rate={value!r}: ")
    assert "expected a number" in msg


def test_slo_error_is_value_error() -> None:
    assert issubclass(SloError, ValueError)


def test_parse_assignment() -> None:
    assert parse_assignment("ttft_p95=25s", "cli") == (
        None,
        Slo("ttft_p95", 25000.0, True, "ms", "cli"),
    )
    assert parse_assignment(" tpot_mean = 150ms ", "cli")[1].limit == 150.0
    assert parse_assignment("success_rate=0.99", "ini")[1].upper is False
    layout, slo = parse_assignment("pp8:ttft_p95=15s", "cli")
    assert layout == "pp8" and slo.limit == 15000.0


@pytest.mark.parametrize("text", ["ttft_p95", "=25s", "ttft_p95=", "  =  ", "", "ttft_p95: 25s"])
def test_parse_assignment_errors(text: str) -> None:
    with pytest.raises(SloError) as info:
        parse_assignment(text, "--slo")
    assert str(info.value) == f"--slo: expected NAME=VALUE (e.g. ttft_p95=25s), got {text!r}"


def test_parse_assignment_bad_value_names_the_slo() -> None:
    with pytest.raises(SloError, match=r"^--slo: SLO ttft_p95='25s=3': expected a duration"):
        parse_assignment("ttft_p95=25s=3", "--slo")


def test_from_mapping_sources() -> None:
    slos = from_mapping({"ttft_p95": "30s", "tpot_mean": "150ms"}, "clusters/local.yaml")
    assert slos == [
        Slo("ttft_p95", 30000.0, True, "ms", "clusters/local.yaml slo.ttft_p95"),
        Slo("tpot_mean", 150.0, True, "ms", "clusters/local.yaml slo.tpot_mean"),
    ]


def test_from_mapping_error_names_file_and_field() -> None:
    with pytest.raises(SloError) as info:
        from_mapping({"ttft_p95": "soon"}, "clusters/x.yaml")
    assert str(info.value).startswith("clusters/x.yaml slo.ttft_p95: SLO ttft_p95='soon'")


def test_merge_precedence() -> None:
    yaml_layer = from_mapping({"ttft_p95": "30s", "tpot_mean": "150ms"}, "c.yaml")
    ini_layer = [parse_assignment("ttft_p95=25s", "ini")[1]]
    cli_layer = [
        parse_assignment("ttft_p95=20s", "cli")[1],
        parse_assignment("success_rate=1", "cli")[1],
    ]
    merged = merge(yaml_layer, ini_layer, cli_layer)
    assert list(merged) == ["ttft_p95", "tpot_mean", "success_rate"]
    assert merged["ttft_p95"] == Slo("ttft_p95", 20000.0, True, "ms", "cli")
    assert merged["tpot_mean"].source == "c.yaml slo.tpot_mean"
    assert merged["success_rate"].limit == 1.0
    # Reversed order: the YAML value wins.
    assert merge(cli_layer, ini_layer, yaml_layer)["ttft_p95"].limit == 30000.0


def test_merge_empty() -> None:
    assert merge() == {}
    assert merge([], []) == {}


# ----------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (float("nan"), "ms", "n/a"),
        (float("nan"), "tok/s", "n/a"),
        (999.94, "ms", "999.9 ms"),
        (1000.0, "ms", "1.00 s"),
        (-1500.0, "ms", "-1.50 s"),
        (-75.0, "ms", "-75.0 ms"),
        (2.0, "tok/s", "2 tok/s"),
        (8 / 3, "tok/s", "2.667 tok/s"),
        (0.99, "", "0.99"),
        (23456.0, "req/s", "2.346e+04 req/s"),
    ],
)
def test_format_value(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


def test_describe() -> None:
    assert parse_slo("ttft_p95", "25s", "x").describe() == "ttft_p95 <= 25.00 s"
    assert parse_slo("tpot_mean", "150ms", "x").describe() == "tpot_mean <= 150.0 ms"
    assert parse_slo("success_rate", "0.99", "x").describe() == "success_rate >= 0.99"
    assert parse_slo("output_throughput", "2", "x").describe() == "output_throughput >= 2 tok/s"


# ----------------------------------------------------------------------------- verdicts


def test_upper_bound_met(summary: Summary) -> None:
    v = evaluate(parse_slo("ttft_p95", "1s", "cli"), summary)
    assert v.measured == pytest.approx(975.0)
    assert v.passed
    assert v.margin == pytest.approx(25.0)
    assert v.message() == (
        "SLO ttft_p95 <= 1.00 s met: measured 975.0 ms, margin 25.0 ms (+2.5%) [from cli]"
    )


def test_upper_bound_violated(summary: Summary) -> None:
    v = evaluate(parse_slo("ttft_p95", "900ms", "c.yaml slo.ttft_p95"), summary)
    assert not v.passed
    assert v.margin == pytest.approx(-75.0)
    # -75 / 900 = -8.33 %
    assert v.message() == (
        "SLO ttft_p95 <= 900.0 ms VIOLATED: measured 975.0 ms, margin -75.0 ms (-8.3%) "
        "[from c.yaml slo.ttft_p95]"
    )


def test_upper_bound_equal_passes() -> None:
    v = Verdict(parse_slo("tpot_p95", "500ms", "x"), 500.0)
    assert v.passed and v.margin == 0.0


def test_lower_bound_met(summary: Summary) -> None:
    v = evaluate(parse_slo("output_throughput", "2", "ini"), summary)
    assert v.measured == pytest.approx(8 / 3)
    assert v.passed
    assert v.margin == pytest.approx(2 / 3)
    # margin / limit = (2/3) / 2 = +33.3 %
    assert v.message() == (
        "SLO output_throughput >= 2 tok/s met: measured 2.667 tok/s, "
        "margin 0.6667 tok/s (+33.3%) [from ini]"
    )


def test_lower_bound_violated(summary: Summary) -> None:
    v = evaluate(parse_slo("success_rate", "0.9", "cli"), summary)
    assert v.measured == pytest.approx(2 / 3)
    assert not v.passed
    assert v.margin == pytest.approx(2 / 3 - 0.9)
    # (2/3 - 0.9) / 0.9 = -25.9 %
    assert v.message() == (
        "SLO success_rate >= 0.9 VIOLATED: measured 0.6667, margin -0.2333 (-25.9%) [from cli]"
    )


def test_lower_bound_equal_passes(summary: Summary) -> None:
    v = evaluate(parse_slo("completed", "2", "cli"), summary)
    assert v.measured == 2.0 and v.passed and v.margin == 0.0


def test_zero_limit_has_no_relative_margin() -> None:
    v = Verdict(parse_slo("completed", "0", "cli"), 3.0)
    assert v.passed
    assert v.message() == "SLO completed >= 0 met: measured 3, margin 3 [from cli]"


@pytest.mark.parametrize("name", ["ttft_p95", "tpot_mean", "output_throughput", "success_rate"])
def test_nan_measurement_fails(name: str) -> None:
    empty = summarize([])  # nothing ran: every latency and rate is NaN
    v = evaluate(parse_slo(name, "1", "cli"), empty)
    assert math.isnan(v.measured)
    assert not v.passed
    assert "VIOLATED" in v.message()
    assert "measured n/a" in v.message()


def test_nan_measurement_fails_for_upper_and_lower() -> None:
    for slo in (Slo("ttft_p95", 1e9, True, "ms", "x"), Slo("completed", -1.0, False, "", "x")):
        assert not Verdict(slo, float("nan")).passed


def test_evaluate_uses_summary_metric(summary: Summary) -> None:
    for name in ("ttft_mean", "tpot_p95", "e2e_max", "itl_median", "total_throughput"):
        v = evaluate(parse_slo(name, "1", "x"), summary)
        assert v.measured == summary.metric(name)
    assert evaluate(parse_slo("e2e_max", "1", "x"), summary).measured == pytest.approx(3000.0)


# ----------------------------------------------------------------------------- known bugs


def test_nan_message_has_no_nan_percentage() -> None:
    v = Verdict(parse_slo("ttft_p95", "25s", "cli"), float("nan"))
    assert "nan" not in v.message().lower().replace("n/a", "")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_lower_bound_rejected(value: str) -> None:
    with pytest.raises(SloError):
        parse_slo("success_rate", value, "cli")


def test_goodput_is_a_lower_bound_slo() -> None:
    slo = parse_slo("goodput", "0.1", "cli")
    assert not slo.upper and slo.unit == "req/s"
