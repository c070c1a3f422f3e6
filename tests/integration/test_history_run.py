"""Runs on the mock go into the history (what identifies each run, and each layout's figures as
its summary.json has them), and the history gate judges each night against them."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

import pytest

from pytest_kimi.judge.history import History
from pytest_kimi.mock.perfmodel import Profile

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
SMALL_CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()
GATED = 3  # ttft_p95, tpot_mean, output_throughput: the default thresholds' metrics


def test_nightly_runs_build_a_history_and_its_gate_finds_the_slower_night(
    pytester: pytest.Pytester, monkeypatch
) -> None:
    """Issue 19's "done when", on the small cluster: three runs into one history pass the
    history gate; a fourth on a cluster file whose mock step overhead is doubled fails it,
    naming the metric and the run where the change starts."""
    pytester.makepyfile(test_speedbench=PERF_TEST)
    common = ["--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out",
              "--kimi-gate=history", "-p", "no:cacheprovider"]  # fmt: skip
    first_file = pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    first_sha = hashlib.sha256(first_file.read_bytes()).hexdigest()
    first = pytester.runpytest_subprocess(*common, "--kimi-history=hist/h.sqlite",
                                          "--kimi-commit=abc123")  # fmt: skip
    first.assert_outcomes(passed=5 + GATED)
    # the others name their history in the cluster file (relative to it) and their commit in
    # the environment, as a nightly job would
    nightly = SMALL_CLUSTER + "history: hist/h.sqlite\n"
    second_file = pytester.makefile(".yaml", cluster=nightly)
    monkeypatch.setenv("KIMI_COMMIT", "def456")
    for _ in range(2):
        again = pytester.runpytest_subprocess(*common)
        again.assert_outcomes(passed=5 + GATED)
        again.stdout.fnmatch_lines(["*added to the history*hist/h.sqlite*"])

    history = History(pytester.path / "hist" / "h.sqlite")
    runs = history.runs()
    folders = sorted((pytester.path / "out").iterdir())
    assert [r.run_id for r in runs] == [f.name for f in folders]
    assert [r.git_commit for r in runs] == ["abc123", "def456", "def456"]
    second_sha = hashlib.sha256(second_file.read_bytes()).hexdigest()
    assert [r.cluster_sha256 for r in runs] == [first_sha, second_sha, second_sha]
    router = f"smg {metadata.version('smg')}"  # the package and release the router's node runs
    assert all(r.complete and r.sglang == "0.5.23-kimi-mock" and r.router == router for r in runs)
    for run, folder in zip(runs, folders, strict=True):
        summary = json.loads((folder / "deep" / "summary.json").read_text())
        [stored] = history.results(run.run_id)
        assert (stored.layout, stored.point) == ("deep", "")
        assert stored.metrics["ttft_p95"] == pytest.approx(summary["p95_ttft_ms"], abs=1e-9)
        assert stored.workload["concurrency"] == 2 and len(stored.samples["ttft"]) == 6
    # the same workload, prompts and timing: one experiment, so one series of three runs
    [key] = {history.results(run.uid)[0].experiment for run in runs}
    series = history.series(key, "deep", "", "tpot_mean", cluster=runs[0].cluster)
    assert [e.run.git_commit for e in series] == ["abc123", "def456", "def456"]

    # the fourth night runs a slower build: every decode step costs twice as long
    overhead = 2 * Profile().step_overhead_ms
    pytester.makefile(".yaml", cluster=nightly.replace(
        "mock: {time_scale: 400, seed: 3}",
        f"mock: {{time_scale: 400, seed: 3, profile: {{step_overhead_ms: {overhead}}}}}"))
    slower = pytester.runpytest_subprocess(*common)
    outcomes = slower.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, slower.stdout.str()
    fourth = sorted((pytester.path / "out").iterdir())[-1].name
    slower.stdout.fnmatch_lines([
        "*test_no_regression?deep-tpot_mean?*",
        f"*REGRESSION: deep tpot_mean * worse than its level*the change starts at this run "
        f"({fourth}); against run {runs[-1].run_id} before it: cluster file SHA-256 "
        f"{second_sha} -> *",
    ])  # fmt: skip
    # the truth of "slower" is the records, not the gate: tonight's TPOT is well above the
    # three nights' (from the summaries the runs wrote)
    tpots = [json.loads((pytester.path / "out" / name / "deep" / "summary.json").read_text())
             ["mean_tpot_ms"] for name in [*(f.name for f in folders), fourth]]  # fmt: skip
    assert tpots[3] > 1.1 * max(tpots[:3])
    assert len(history.runs()) == 4  # a failed gate still adds the night to the history
