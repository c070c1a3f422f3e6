"""The experiment matrix on the mock, as issue 18 asks:
``pytest tests/perf --layout=tp32,pp8 --kimi-concurrency 4,8 --kimi-num-prompts 16``.

Truth from outside the code under test: every server process goes through a wrapper script
that writes one line per start (so "each layout brought up once" is counted by the OS's
exec, not by our progress lines), and concurrency is recomputed here from each record's
start and end times."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from pytest_kimi.config.options import DEFAULT_CLUSTER

pytest_plugins = ["pytester"]

PERF_TEST = (Path(__file__).parents[1] / "perf" / "test_speedbench.py").read_text()
WRAPPER = """\
#!/bin/sh
# one line per command run as a server is (servers, and the version probes at bring-up), then
# the command itself (same PID: exec)
echo "$*" >> "$(dirname "$0")/starts.log"
exec "$@"
"""


def peak_in_flight(records: list[dict]) -> int:
    """The most measured requests between their start and their end at any one time."""
    edges = sorted(
        [(r["start_time"], 1) for r in records] + [(r["end_time"], -1) for r in records],
        key=lambda edge: (edge[0], edge[1]),  # an end before a send at the same instant
    )
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_two_layouts_at_two_points(pytester: pytest.Pytester, leftovers) -> None:
    """Each layout brought up once serves both points; items, folders and the report follow
    the (layout, point) matrix."""
    wrapper = pytester.path / "count-starts.sh"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    cluster = yaml.safe_load(DEFAULT_CLUSTER.read_text())
    cluster["server"]["wrapper"] = [str(wrapper)]
    cluster["mock"]["time_scale"] = 200  # 5x the shipped: one clock keeps cluster time the same
    (pytester.path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    pytester.makepyfile(test_speedbench=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=tp32,pp8", "--kimi-concurrency", "4,8",
        "--kimi-num-prompts", "16", "--kimi-report-dir=out", "--junitxml=junit.xml",
        "-p", "no:cacheprovider", "--kimi-progress=plain",
    )  # fmt: skip
    [folder] = list((pytester.path / "out").iterdir())
    # per (layout, point): every request succeeded, three SLOs, the benchmark record
    result.assert_outcomes(passed=2 * 2 * (1 + 3 + 1))
    wrapped = (pytester.path / "starts.log").read_text().splitlines()
    starts = [line for line in wrapped if "-m pytest_kimi.mock.launch_server " in line]
    assert len(starts) == 2 * 2 * 4  # 2 layouts x 2 replicas x 4 nodes, each started once
    assert sum("--tp-size 32 --pp-size 1" in s for s in starts) == 8
    assert sum("--tp-size 4 --pp-size 8" in s for s in starts) == 8
    for layout in ("tp32", "pp8"):
        for concurrency in (4, 8):
            lines = (folder / layout / f"c{concurrency}" / "records.jsonl").read_text()
            records = [json.loads(line) for line in lines.splitlines()]
            measured = [r for r in records if not r["warmup"]]
            assert len(measured) == 16 and all(r["success"] for r in measured)
            assert peak_in_flight(measured) == concurrency
    assert leftovers(pytester.path) == []
    names = {case.get("name") for case in ET.parse(pytester.path / "junit.xml").iter("testcase")}
    assert {"test_slo[tp32-c8-ttft_p95]", "test_slo[pp8-c4-tpot_p95]",
            "test_every_request_succeeded[pp8-c8]", "test_workload[tp32-c4]"} <= names  # fmt: skip

    model = json.loads((folder / "comparison.json").read_text())
    assert [p["id"] for p in model["points"]] == ["c4", "c8"]
    for point in model["points"]:
        assert [lay["name"] for lay in point["layouts"]] == ["tp32", "pp8"]
        completed = next(r for r in point["rows"] if r["metric"] == "completed")
        assert completed["values"] == {"tp32": 16, "pp8": 16}
    assert [(v["point"], v["meeting"]) for v in model["verdicts"]] == [
        ("c4", ["tp32", "pp8"]),
        ("c8", ["tp32", "pp8"]),
    ]
    assert {v["best"] for v in model["verdicts"]} <= {"tp32", "pp8"}
    assert {name: [p["concurrency"] for p in c] for name, c in model["pareto"].items()} == {
        "tp32": [4, 8],
        "pp8": [4, 8],
    }
    assert model["setup"]["dataset"]["workload"]["concurrency"] == "4, 8"
    markdown = (folder / "comparison.md").read_text()
    assert "## Workload point c4" in markdown and "## Verdict" in markdown
    assert (folder / "pareto.svg").read_text().lstrip().startswith("<svg")
    assert 'id="pareto"' in (folder / "report.html").read_text()
