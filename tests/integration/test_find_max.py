"""--kimi-find-max-concurrency on the mock: each level the search tried is a measured point
with its own records, and the search's answer agrees with what this test reads in them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
SMALL_CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()
# the cluster file's limits in seconds ("600s"), read here, not by the code under test
FILE_SLO_S = {name: float(limit.removesuffix("s"))
              for name, limit in yaml.safe_load(SMALL_CLUSTER)["slo"].items()}  # fmt: skip


def meets_slos(records: list[dict], time_scale: float) -> bool:
    """This test's own reading of the run against its SLOs (bench_serving's definitions,
    numpy's percentiles): every request succeeded, TTFT p95 and TPOT mean within the cluster
    file's limits, TPOT p95 <= 200 ms (the command line's), in cluster time."""
    measured = [r for r in records if not r["warmup"]]
    if not all(r["success"] for r in measured):
        return False
    ttft = [(r["first_token_time"] - r["start_time"]) * time_scale for r in measured]
    tpot = [(r["end_time"] - r["first_token_time"]) * time_scale / (r["completion_tokens"] - 1)
            for r in measured if r["completion_tokens"] > 1]  # fmt: skip
    return (
        float(np.percentile(ttft, 95)) <= FILE_SLO_S["ttft_p95"]
        and float(np.percentile(tpot, 95)) <= 0.200
        and float(np.mean(tpot)) <= FILE_SLO_S["tpot_mean"]
    )


def test_the_search_agrees_with_each_levels_records(pytester: pytest.Pytester, leftovers) -> None:
    pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=deep", "--kimi-concurrency", "1,6",
        "--kimi-find-max-concurrency", "--kimi-slo", "tpot_p95=200ms", "--kimi-report-dir=out",
        "-p", "no:cacheprovider", "--kimi-progress=plain", "-v",
    )  # fmt: skip
    [folder] = list((pytester.path / "out").iterdir())
    search = json.loads((folder / "deep" / "search.json").read_text())
    scale = yaml.safe_load(SMALL_CLUSTER)["mock"]["time_scale"]
    met: dict[int, bool] = {}
    for level in search["tried"]:
        lines = (folder / "deep" / f"c{level}" / "records.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert len(records) == 6 + 1  # measured + warm-up, at every level
        met[level] = meets_slos(records, scale)
    passed = [level for level, ok in met.items() if ok]
    failed = [level for level, ok in met.items() if not ok]
    # the mock's TPOT p95 is ~60 ms at concurrency 1 and ~500 ms at 6: the 200 ms limit lies
    # inside the range, so the search must bisect to two adjacent levels
    assert passed and failed, met
    assert search["max_concurrency"] == max(passed) == min(failed) - 1
    assert search["first_failing"] == min(failed)
    assert search["failed_slos"] == ["tpot_p95"] and not search["incomplete"]
    assert search["tried"][:2] == [1, 2] and len(set(search["tried"])) == len(search["tried"])
    # the listed levels were measured once: the search reused them
    for level in (1, 6):
        assert result.outlines.count(f"[kimi deep-c{level}] measuring 6 requests") == 1
    result.stdout.fnmatch_lines(["*test_max_concurrency[[]deep[]] PASSED*"])
    verdict = (folder / "comparison.md").read_text()
    tried = ", ".join(str(level) for level in search["tried"])
    assert f"- **deep**: {search['max_concurrency']} (" in verdict and f"tried {tried}" in verdict
    assert leftovers(pytester.path) == []
