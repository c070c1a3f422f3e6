"""The regression gate's judgement: direction-aware, threshold- and noise-aware."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pytest_kimi.judge.baseline import judge
from pytest_kimi.results.baselinefile import BaselineError, load, parse_thresholds, save, snapshot


def _entry(tpot_ms: np.ndarray, output_tps: float) -> dict:
    return {
        "metrics": {"tpot_mean": float(tpot_ms.mean()), "output_throughput": output_tps},
        "samples": {"tpot": tpot_ms.tolist(), "ttft": [], "e2e": []},
    }


def test_thresholds_parse_percent_and_fractions_and_name_problems():
    assert parse_thresholds("ttft_p95:10%, tpot_mean:0.05", "cli") == {
        "ttft_p95": pytest.approx(0.10), "tpot_mean": 0.05,
    }  # fmt: skip
    with pytest.raises(BaselineError, match="cli: 'speed' is not a metric"):
        parse_thresholds("speed:5%", "cli")
    with pytest.raises(BaselineError, match="expected METRIC:PERCENT"):
        parse_thresholds("ttft_p95", "cli")
    with pytest.raises(BaselineError, match="not a number"):
        parse_thresholds("ttft_p95:ten%", "cli")


def test_real_latency_regression_beyond_threshold_and_noise_fails():
    rng = np.random.default_rng(0)
    base = _entry(rng.normal(80, 4, 40), 85.0)
    slow = _entry(rng.normal(100, 4, 40), 85.0)  # +25 %
    j = judge("tp32", "tpot_mean", 0.05, base, slow)
    assert j.regressed and j.change == pytest.approx(0.25, abs=0.03)
    assert j.ci_low > 0.15
    assert "REGRESSION: tp32 tpot_mean" in j.message() and "threshold 5%" in j.message()


def test_noise_within_the_interval_does_not_fail_even_past_the_threshold():
    rng = np.random.default_rng(1)
    base = _entry(rng.lognormal(4.4, 0.6, 8), 85.0)  # 8 very noisy requests
    other = _entry(rng.lognormal(4.4, 0.6, 8), 85.0)
    j = judge("pp8", "tpot_mean", 0.01, base, other)
    if abs(j.change) > 0.01:  # past the tiny threshold, but the interval straddles zero
        assert j.ci_low < 0 < j.ci_high and not j.regressed


def test_throughput_down_is_a_regression_up_is_not():
    rng = np.random.default_rng(2)
    tpot = rng.normal(80, 1, 40)
    base = _entry(tpot, 100.0)
    assert judge("tp32", "output_throughput", 0.05, base, _entry(tpot, 90.0)).regressed
    better = judge("tp32", "output_throughput", 0.05, base, _entry(tpot, 120.0))
    assert not better.regressed and better.change == pytest.approx(-0.2)


def test_a_metric_that_vanished_is_not_a_pass():
    base = _entry(np.array([80.0, 81.0]), 100.0)
    gone = {"metrics": {"output_throughput": None}, "samples": {}}
    j = judge("tp32", "output_throughput", 0.05, base, gone)
    assert math.isnan(j.change) and j.regressed


def test_save_and_load_round_trip_and_bad_files(tmp_path: Path):
    path = tmp_path / "b" / "base.json"
    save(path, snapshot({"tp32": _entry(np.array([1.0, 2.0]), 3.0)}, {"cluster": "c"}))
    assert load(path)["layouts"]["tp32"]["metrics"]["output_throughput"] == 3.0
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(BaselineError, match="not a pytest-kimi baseline"):
        load(tmp_path / "x.json")
    with pytest.raises(BaselineError, match="cannot read baseline"):
        load(tmp_path / "missing.json")
