"""``--kimi-repeat N`` end to end on the small mock cluster: every run kept, the between-run
figures written, the prefix caches emptied between runs on the deployment kept, and with
``--kimi-repeat-fresh`` a deployment per run. What the servers cached comes from their own
answers (each response's ``cached_tokens``), the deployments from the bring-up lines and the
logs each one left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()
# the prefix cache on (the small cluster turns it off) with room for every prompt (the recorded
# servers' 32,768 tokens hold two): a run that read from it what an earlier one sent would show
# it in its requests' cached tokens. 7 requests and a warm-up a run: round robin sends each
# prompt to the same replica in every run
CLUSTER = (HERE / "small_cluster.yaml").read_text().replace(
    ", disable-radix-cache: true", ", max-total-tokens: 262144")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    assert "disable-radix-cache" not in CLUSTER
    pytester.makefile(".yaml", cluster=CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    return pytester


def _run(project: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, Path]:
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out", "-p",
        "no:cacheprovider", *args,
    )  # fmt: skip
    runs = list((project.path / "out").iterdir()) if (project.path / "out").exists() else []
    return result, (runs[0] if runs else project.path)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_three_runs_on_one_deployment_keep_every_run_and_their_spread(project, leftovers):
    result, run = _run(project, "--kimi-repeat=3", "--kimi-num-prompts=7")
    result.assert_outcomes(passed=5)
    out = result.stdout.str()
    assert out.count("] bringing up ") == 1  # the deployment kept
    assert "deep: ttft_p95 over 3 runs: mean " in out
    folder = run / "deep"
    records = _lines(folder / "records.jsonl")
    measured = [r for r in records if not r["warmup"]]
    assert sorted(r["repeat"] for r in measured) == [1] * 7 + [2] * 7 + [3] * 7
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["completed"] == 21 and len(summary["repeats"]) == 3
    for i, each in enumerate(summary["repeats"], 1):
        own = _lines(folder / f"repeat-{i}" / "records.jsonl")
        assert len(own) == 8 and {r["repeat"] for r in own} == {i}  # its warm-up and its seven
        assert each["completed"] == 7
    spread = summary["between_runs"]["ttft_p95"]
    assert spread["runs"] == 3
    assert spread["values"] == [each["p95_ttft_ms"] for each in summary["repeats"]]
    assert spread["lower"] <= spread["mean"] <= spread["upper"]
    throughputs = [each["output_throughput"] for each in summary["repeats"]]
    assert summary["output_throughput"] == pytest.approx(sum(throughputs) / 3)
    # each run starts with empty caches: the servers found no earlier run's prompts in them
    for i in (1, 2, 3):
        mine = [r for r in measured if r["repeat"] == i]
        cached = sum(r["cached_tokens"] or 0 for r in mine)
        assert cached < 0.1 * sum(r["prompt_tokens"] for r in mine), (i, cached)
    text = (run / "comparison.md").read_text()
    assert "## Between runs" in text and "| ttft_p95 | deep | 3 |" in text
    assert "Between runs" in (run / "report.html").read_text()
    assert leftovers(project.path) == []


def test_fresh_repeats_bring_the_layout_up_for_each_run(project, leftovers):
    result, run = _run(project, "--kimi-repeat=2", "--kimi-repeat-fresh")
    result.assert_outcomes(passed=5)
    assert result.stdout.str().count("] bringing up ") == 2
    folder = run / "deep"
    first, last = folder / "repeat-1", folder
    for where in (first, last):  # each deployment's own logs and manifest
        assert "ready to roll" in (where / "logs" / "replica0-node0-n1.log").read_text()
        assert (where / "logs" / "router.log").is_file()
        assert json.loads((where / "manifest.json").read_text())["processes"]
    assert (folder / "repeat-2" / "records.jsonl").is_file()
    summary = json.loads((folder / "summary.json").read_text())
    assert len(summary["repeats"]) == 2 and summary["completed"] == 12
    assert any(n.startswith("repeats: 2 deployments") for n in summary["notes"])
    assert leftovers(project.path) == []
