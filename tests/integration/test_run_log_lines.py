"""Log lines during the measured run, on the mock: the plain progress shows a process's last
log line, prefixed with its name and node, while the layout is measured (``logs.tail_report_s``).

The router writes a line per request it routes, so its last line changes during the run; the
mock servers log nothing per request (real SGLang writes "Decode batch" lines), so the line
expected here is the router's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()
LOG_LINE = re.compile(r"^\[kimi wide\] log (\S+) \((n\d)\): \S")


def _run(pytester: pytest.Pytester, tail_report_s: float) -> list[str]:
    """The plain progress lines of a run of layout ``wide`` slow enough to last ~2 s."""
    cluster = (
        CLUSTER.replace("time_scale: 400", "time_scale: 10").replace(
            "num_requests: 6", "num_requests: 16"
        )
        + f"logs: {{tail_report_s: {tail_report_s}}}\n"
    )
    pytester.makefile(".yaml", cluster=cluster)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide", "--kimi-report-dir=out", "-p",
        "no:cacheprovider", "--kimi-progress=plain",
    )  # fmt: skip
    result.assert_outcomes(passed=5)
    return result.stdout.lines


def test_plain_progress_shows_log_lines_while_the_layout_is_measured(
    pytester: pytest.Pytester, leftovers
):
    lines = _run(pytester, 0.2)
    start = next(i for i, x in enumerate(lines) if x.startswith("[kimi wide] measuring "))
    end = next(i for i, x in enumerate(lines) if x.startswith("[kimi wide] measured "))
    during = [m.groups() for x in lines[start:end] if (m := LOG_LINE.match(x))]
    assert ("router", "n1") in during, "\n".join(lines[start : end + 1])
    assert not leftovers(pytester.path)


def test_zero_turns_them_off(pytester: pytest.Pytester, leftovers):
    lines = _run(pytester, 0)
    assert not [x for x in lines if LOG_LINE.match(x)]
    assert not leftovers(pytester.path)
