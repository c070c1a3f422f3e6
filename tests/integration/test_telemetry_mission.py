"""The mission on the mock, small: every node's GPUs are sampled while each layout is measured
(the stand-in nvidia-smi is driven by the mock's own load), and report.html shows them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_kimi.deploy.telemetry import ATTACHED_NOTE
from pytest_kimi.results.telemetry_stats import read_telemetry

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
NODES = [f"node60{i}" for i in range(1, 9)]


def _small_mission() -> str:
    text = (ROOT / "clusters" / "local.yaml").read_text()
    for old, new in (
        ("num_requests: 40", "num_requests: 24"),
        ("output_len: 512", "output_len: 192"),
        ("interval_s: 1.5}", "interval_s: 0.5}"),
        # sampling costs CPU on this machine too: the SLOs are not what this test checks
        ("tpot_p95: 200ms", "tpot_p95: 5s"),
        ("tpot_mean: 150ms", "tpot_mean: 5s"),
        ("ttft_p95: 30s", "ttft_p95: 300s"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_mission_on_the_mock_samples_every_node_and_reports_it(
    pytester: pytest.Pytester, leftovers
):
    pytester.makefile(".yaml", cluster=_small_mission())
    pytester.makepyfile(test_speedbench=(ROOT / "tests/perf/test_speedbench.py").read_text())
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=tp32,pp8", "--kimi-report-dir=out",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(["*GPU utilization mean (%)*", "*GPU energy per output token*"])
    [run] = list((pytester.path / "out").iterdir())
    for layout in ("tp32", "pp8"):
        series = read_telemetry(run / layout / "telemetry.jsonl")
        assert series.nodes == tuple(NODES) and series.errors == {}
        assert series.measured is not None
        start, end = series.measured
        busy = {
            s.node
            for s in series.samples
            if start <= s.t <= end and (s.util_pct or 0) > 0 and (s.power_w or 0) > 60
        }
        assert busy == set(NODES), f"{layout}: nodes above idle while measured: {busy}"
        summary = json.loads((run / layout / "summary.json").read_text())
        figures = summary["telemetry"]
        assert figures["gpus"] == 64 and figures["rounds"] >= 1
        assert 0 < figures["gpu_util_mean"] <= figures["gpu_util_peak"] <= 100
        assert figures["power_mean_w"] > 64 * 60 and figures["energy_per_output_token_j"] > 0
        assert not [n for n in summary["notes"] if n.startswith("telemetry:")], summary["notes"]
    page = (run / "report.html").read_text()
    timeline = re.search(r'<figure id="timeline">(.*?)</figure>', page, re.S).group(1)
    assert "tp32: GPUs per node" in timeline and "pp8: GPUs per node" in timeline
    assert all(f"<!-- {node} -->" in timeline for node in NODES)
    assert "GPU power mean (W, all GPUs)" in page
    assert leftovers(pytester.path) == []


def test_attached_to_an_endpoint_there_is_no_telemetry_and_the_report_says_so(
    pytester: pytest.Pytester, mock_server
):
    pytester.makefile(".yaml", cluster=(Path(__file__).parent / "small_cluster.yaml").read_text())
    pytester.makepyfile(test_speedbench=(ROOT / "tests/perf/test_speedbench.py").read_text())
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide", f"--kimi-endpoint={mock_server}",
        "--kimi-report-dir=out", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=5)
    [run] = list((pytester.path / "out").iterdir())
    assert not (run / "wide" / "telemetry.jsonl").exists()
    summary = json.loads((run / "wide" / "summary.json").read_text())
    assert ATTACHED_NOTE in summary["notes"] and "telemetry" not in summary
    page = (run / "report.html").read_text()
    assert "no GPU telemetry for wide (see the notes)" in page
    assert "GPU utilization mean" not in page  # no rows of figures nobody measured
