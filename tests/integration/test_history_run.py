"""Runs on the mock go into the history: what identifies each run, and each layout's figures as
its summary.json has them."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

import pytest

from pytest_kimi.history import History

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
SMALL_CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()


def test_two_runs_land_in_one_history(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makepyfile(test_speedbench=PERF_TEST)
    common = ["--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out",
              "-p", "no:cacheprovider"]  # fmt: skip
    first_file = pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    first_sha = hashlib.sha256(first_file.read_bytes()).hexdigest()
    first = pytester.runpytest_subprocess(*common, "--kimi-history=hist/h.sqlite",
                                          "--kimi-commit=abc123")  # fmt: skip
    first.assert_outcomes(passed=5)
    # the second names its history in the cluster file (relative to it) and its commit in
    # the environment, as a nightly job would
    second_file = pytester.makefile(".yaml", cluster=SMALL_CLUSTER + "history: hist/h.sqlite\n")
    monkeypatch.setenv("KIMI_COMMIT", "def456")
    second = pytester.runpytest_subprocess(*common)
    second.assert_outcomes(passed=5)
    second.stdout.fnmatch_lines(["*added to the history*hist/h.sqlite*"])

    history = History(pytester.path / "hist" / "h.sqlite")
    runs = history.runs()
    folders = sorted((pytester.path / "out").iterdir())
    assert [r.run_id for r in runs] == [f.name for f in folders]
    assert [r.git_commit for r in runs] == ["abc123", "def456"]
    assert [r.cluster_sha256 for r in runs] == [
        first_sha, hashlib.sha256(second_file.read_bytes()).hexdigest()
    ]  # fmt: skip
    router = metadata.version("sglang-router")  # what the router's node (this machine) runs
    assert all(r.complete and r.sglang == "0.5.9-kimi-mock" and r.router == router for r in runs)
    for run, folder in zip(runs, folders, strict=True):
        summary = json.loads((folder / "deep" / "summary.json").read_text())
        [stored] = history.results(run.run_id)
        assert (stored.layout, stored.point) == ("deep", "")
        assert stored.metrics["ttft_p95"] == pytest.approx(summary["p95_ttft_ms"], abs=1e-9)
        assert stored.workload["concurrency"] == 2 and len(stored.samples["ttft"]) == 6
    # the same workload, prompts and timing: one experiment, so one series of two runs
    [key] = {history.results(run.uid)[0].experiment for run in runs}
    series = history.series(key, "deep", "", "ttft_p95")
    assert [e.run.git_commit for e in series] == ["abc123", "def456"]

    # a history that cannot be written is said; the run and its report are not lost
    (pytester.path / "not-a-file").mkdir()
    third = pytester.runpytest_subprocess(*common, "--kimi-history=not-a-file")
    third.assert_outcomes(passed=5)
    third.stdout.fnmatch_lines(["*history NOT written: *not-a-file*"])
    assert len(list((pytester.path / "out").iterdir())) == 3
