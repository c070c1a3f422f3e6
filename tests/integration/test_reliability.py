"""Faults during a run: each is explained, records and logs are kept, nothing is left running."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
SMALL = (ROOT / "tests" / "integration" / "test_plugin.py").read_text()
CLUSTER = SMALL.split('SMALL_CLUSTER = """\\\n', 1)[1].split('"""', 1)[0]
PERF_TEST = (ROOT / "tests" / "perf" / "test_speedbench.py").read_text()


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_speedbench=PERF_TEST)
    return pytester


def test_worker_crash_mid_run_is_counted_explained_and_cleaned_up(
    project: pytest.Pytester, leftovers
):
    # replica 0 generates 4 warm-up tokens (+8 if the router's warm-up lands there) before the
    # measured run and at least 24 during it: token 16 always falls inside the measured run
    crashing = CLUSTER.replace(
        "  - {name: n1, host: 127.0.0.1, gpus: 4}",
        "  - {name: n1, host: 127.0.0.1, gpus: 4, env: {KIMI_MOCK_FAULT: crash_after_tokens=16}}",
    )
    project.makefile(".yaml", cluster=crashing)
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide", "--kimi-report-dir=out", "-p",
        "no:cacheprovider", "-v", "--kimi-slo=success_rate=1",
    )  # fmt: skip
    result.stdout.fnmatch_lines(["*test_every_request_succeeded?wide? FAILED*"])
    result.stdout.fnmatch_lines(["*test_slo?wide-success_rate? FAILED*"])
    [run] = list((project.path / "out").iterdir())
    summary = json.loads((run / "wide" / "summary.json").read_text())
    assert summary["failed"] > 0 and summary["completed"] > 0  # the run finished
    records = [json.loads(x) for x in (run / "wide" / "records.jsonl").read_text().splitlines()]
    failed = [r for r in records if not r["success"]]
    assert failed and all(r["error"] for r in failed)  # kept, with the reason
    assert any("EngineDeadError" in n for n in summary["notes"])  # the data-quality note
    assert "EngineDeadError" in (run / "wide" / "logs" / "replica0-node0-n1.log").read_text()
    assert leftovers(project.path) == []


def test_port_already_in_use_names_node_and_port(project: pytest.Pytester, leftovers):
    holder = socket.socket()
    holder.bind(("127.0.0.11", 0))  # something else already listens on node n1's port
    holder.listen()
    port = holder.getsockname()[1]
    try:
        fixed = CLUSTER.replace(
            "  args: {chunked-prefill-size: 8192, disable-radix-cache: true}",
            f"  port: {port}\n  args: {{chunked-prefill-size: 8192, disable-radix-cache: true}}",
        )
        for i in range(1, 5):  # distinct loopback addresses: a fixed port per host is fine
            fixed = fixed.replace(f"name: n{i}, host: 127.0.0.1", f"name: n{i}, host: 127.0.0.1{i}")
        project.makefile(".yaml", cluster=fixed)
        result = project.runpytest_subprocess("--cluster=cluster.yaml", "--layout=wide",
                                              "--kimi-report-dir=out")  # fmt: skip
    finally:
        holder.close()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*port {port} (HTTP of replica0-node0-n1) is already in use "
                                 "on node n1 (127.0.0.11)*"])  # fmt: skip
    assert leftovers(project.path) == []


def test_duplicate_fixed_ports_are_a_usage_error(project: pytest.Pytester):
    dup = CLUSTER.replace(
        "  args: {chunked-prefill-size: 8192, disable-radix-cache: true}",
        "  port: 31000\n  dist_init_port: 31000\n"
        "  args: {chunked-prefill-size: 8192, disable-radix-cache: true}",
    )
    project.makefile(".yaml", cluster=dup)
    result = project.runpytest_subprocess("--cluster=cluster.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cluster.yaml:*field 'server.dist_init_port': port 31000 "
                                 "is also server.port*"])  # fmt: skip
