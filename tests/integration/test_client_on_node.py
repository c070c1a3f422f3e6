"""``network.client: on_node`` on the mock: the benchmark client runs as a process of its own
(shipped as a zip, fed a spec file), its events are followed, and the run is measured from
them; a watchdog abort stops it and keeps every record. Over SSH: ``tests/ssh/test_ssh_bastion.py``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from test_watchdog_run import _proc, _victim, pids_where, run_with_fault

from pytest_kimi.testing.processes import pytest_argv

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
CLUSTER = (Path(__file__).parent / "small_cluster.yaml").read_text()
PERF_TEST = (ROOT / "tests" / "perf" / "test_speedbench.py").read_text()
ON_NODE = "network: {client: on_node, client_node: n3}\n"


def _client_pids(marker: str) -> list[int]:
    """Live processes running the on-node client module whose command line has ``marker``."""

    def is_client(pid: str) -> bool:
        argv = _proc(pid, "cmdline")
        return b"pytest_kimi.workload.onnode" in argv and any(marker.encode() in a for a in argv)

    return pids_where(is_client)


def test_the_run_is_sent_and_timed_by_a_client_process_on_the_node(
    pytester: pytest.Pytester, leftovers
) -> None:
    pytester.makepyfile(test_speedbench=PERF_TEST)
    pytester.makefile(".yaml", cluster=CLUSTER + ON_NODE)
    args = ["--cluster=cluster.yaml", "--layout=wide", "--kimi-report-dir=out"]
    done = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    done.assert_outcomes(passed=5, deselected=2)  # the gate and the search: not asked for
    [run] = list((pytester.path / "out").iterdir())
    folder = run / "wide"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["complete"] is True and summary["completed"] == 6
    [note] = [n for n in summary["notes"] if n.startswith("network.client: on_node")]
    assert "node n3" in note
    # every measured record came through the client's events file: the process sent them
    records = [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]
    events = (folder / "logs" / "client" / "client2-n3.events.jsonl").read_text().splitlines()
    sent = {json.loads(x)["record"]["request_id"] for x in events if '"event":"done"' in x}
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 6 and {r["request_id"] for r in measured} == sent
    assert all(r["success"] for r in records)
    assert json.loads(events[-1]) == {"event": "end"}
    assert (folder / "logs" / "client2-n3.log").exists()  # its log, fetched like the servers'
    assert (folder / "logs" / "client" / "pytest_kimi-client.zip").stat().st_size > 0
    assert leftovers(pytester.path) == []


def test_an_abort_stops_the_client_on_the_node_and_keeps_its_records(
    pytester: pytest.Pytester, leftovers
) -> None:
    pytester.makepyfile(test_speedbench=PERF_TEST)
    cluster = (
        CLUSTER.replace(
            "  - {name: n4, host: 127.0.0.1, gpus: 4}",
            "  - {name: n4, host: 127.0.0.1, gpus: 4, env: {KIMI_TEST_VICTIM: on-node-run}}",
        )
        .replace("time_scale: 400", "time_scale: 8")
        .replace("num_requests: 6", "num_requests: 24")
    ) + ON_NODE + "watchdog: {interval_s: 0.3}\n"  # fmt: skip
    pytester.makefile(".yaml", cluster=cluster)
    out = pytester.path / "out"
    argv = [*pytest_argv(), "--cluster=cluster.yaml", "--layout=wide",
            "--kimi-report-dir=out", "-p", "no:cacheprovider", "-v"]  # fmt: skip
    log = pytester.path / "run.log"
    clients: list[int] = []

    def kill_victim() -> None:
        clients.extend(_client_pids(str(pytester.path)))  # the client (and its group's watcher)
        assert clients
        os.killpg(os.getpgid(_victim(b"KIMI_TEST_VICTIM=on-node-run")), signal.SIGKILL)

    # the measured run's client has a finished request; then replica 1's rank 1 is lost
    code = run_with_fault(argv, pytester.path, log, lambda: _measured_done(out), kill_victim)
    text = log.read_text()
    assert code == pytest.ExitCode.TESTS_FAILED, text[-4000:]
    assert _client_pids(str(pytester.path)) == []
    assert not [pid for pid in clients if Path(f"/proc/{pid}").exists()]
    [run] = list(out.iterdir())
    summary = json.loads((run / "wide" / "summary.json").read_text())
    assert summary["error"].startswith("run interrupted after "), summary["error"]
    assert "RunAborted: watchdog: replica1-node1-n4 (replica 1, node n4" in summary["error"]
    records = [json.loads(x) for x in (run / "wide" / "records.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    assert any(r["success"] for r in measured)  # what finished before is kept
    assert len(measured) < 24 and not all(r["success"] for r in measured)
    assert leftovers(pytester.path) == []


def _measured_done(out: Path) -> bool:
    events = list(out.glob("*/wide/logs/client/client2-n3.events.jsonl"))
    return bool(events) and '"event":"done"' in events[0].read_text()
