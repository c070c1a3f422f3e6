"""--kimi-find-max-concurrency on the mock: each level the search tried is a measured point
with its own records and verdicts, and the search's answer agrees with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
SMALL_CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()


def test_the_search_agrees_with_each_levels_own_verdicts(
    pytester: pytest.Pytester, leftovers
) -> None:
    pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=deep", "--kimi-concurrency", "1,6",
        "--kimi-find-max-concurrency", "--kimi-slo", "tpot_p95=200ms", "--kimi-report-dir=out",
        "-p", "no:cacheprovider", "--kimi-progress=plain",
    )  # fmt: skip
    [folder] = list((pytester.path / "out").iterdir())
    search = json.loads((folder / "deep" / "search.json").read_text())
    met: dict[int, bool] = {}
    for level in search["tried"]:
        summary = json.loads((folder / "deep" / f"c{level}" / "summary.json").read_text())
        records = (folder / "deep" / f"c{level}" / "records.jsonl").read_text().splitlines()
        assert len(records) == 6 + 1  # measured + warm-up, at every level
        met[level] = summary["complete"] and all(v["passed"] for v in summary["slo"])
    passed = [level for level, ok in met.items() if ok]
    failed = [level for level, ok in met.items() if not ok]
    # the search's answer is what the levels' own verdicts say: the highest level that met
    # every SLO, and the lowest that did not
    assert search["max_concurrency"] == (max(passed) if passed else None)
    assert search["first_failing"] == (min(failed) if failed else None)
    assert search["tried"][:2] == [1, 2] and len(set(search["tried"])) == len(search["tried"])
    if passed and failed:
        assert search["first_failing"] == search["max_concurrency"] + 1  # bisected to the end
    outcome = "passed" if search["max_concurrency"] is not None else "failed"
    assert result.parseoutcomes().get(outcome, 0) >= 1
    verdict = (folder / "comparison.md").read_text()
    tried = ", ".join(str(level) for level in search["tried"])
    assert f"- **deep**: {search['max_concurrency']}" in verdict and f"tried {tried}" in verdict
    assert leftovers(pytester.path) == []
