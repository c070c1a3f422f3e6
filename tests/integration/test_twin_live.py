"""The twin check on the live product path: the mock's DP2 tp32-vs-pp8 run must show the
seed's headline trade-off (PP8: lower TTFT p95, higher TPOT, longer, lower throughput)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]


def test_mock_dp2_reproduces_the_seed_directions(pytester: pytest.Pytester):
    local = (ROOT / "clusters" / "local.yaml").read_text()
    # the mission's own time scale: at 1:80 a busy 2-core machine's scheduling delays, scaled
    # into cluster time, were enough to lift PP8's TTFT p95 above TP32's (issue 16)
    pytester.makefile(".yaml", local=local)
    pytester.makepyfile(test_speedbench=(ROOT / "tests/perf/test_speedbench.py").read_text())
    result = pytester.runpytest_subprocess(
        "--cluster=local.yaml", "--layout=tp32,pp8", "--kimi-report-dir=out",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=10)
    [run] = list((pytester.path / "out").iterdir())
    rows = {
        r["metric"]: r["values"] for r in json.loads((run / "comparison.json").read_text())["rows"]
    }

    def lower(metric: str) -> bool:
        return rows[metric]["pp8"] < rows[metric]["tp32"]

    assert lower("ttft_p95"), rows["ttft_p95"]
    # TPOT by mean and median: its p95 (a few slow steps) is where a loaded machine's
    # scheduling delays land first, 20% on TP32 in one CI run, so it is not a model direction
    for metric in ("tpot_mean", "tpot_median", "duration"):
        assert not lower(metric), (metric, rows[metric])
    for metric in ("input_throughput", "output_throughput", "total_throughput"):
        assert lower(metric), (metric, rows[metric])
