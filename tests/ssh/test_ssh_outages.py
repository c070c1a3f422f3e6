"""Blips, reboots and stalls on 8 SSH test hosts in namespaces (issue 15).

A 15 s link outage of one node (its link down, everything on it running on) during start-up
or during the measured run must not cost the run: the executor reconnects with back-off
(``ssh.reconnect_s``) and the watchdog tolerates a node that cannot be asked for a few polls.
A node "rebooted" mid-run (its processes killed, its run files gone) is lost: the watchdog
fails the run naming it, and the next run on the same hosts passes. A start-up that stalls
fails with the stall message naming the node and every node's log tail. Nothing is left on
any host, whatever happened. Faults are triggered by what the run writes (logs, records),
never by a sleep racing it; the 15 s outage itself is the fault injected.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from test_ssh_deploy import PERF, ROOT, _assert_no_processes, _cluster_yaml, _run_in_hub

from pytest_kimi.testing.processes import pytest_argv

OUTAGE_S = 15.0


def _yaml(ssh_hosts, tmp_path: Path, *, node_env=None, **changes) -> tuple[Path, dict]:
    path = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml", node_env=node_env)
    data = yaml.safe_load(path.read_text())
    data["ssh"].update(reconnect_s=60, teardown_reconnect_s=120)
    data["watchdog"] = {"interval_s": 1, "misses": 3}
    data["startup_timeout_s"] = 180
    for key, value in changes.items():
        data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


def _argv(cluster: Path, out: Path) -> list[str]:
    return [*pytest_argv(), str(PERF), f"--cluster={cluster}",
            f"--kimi-report-dir={out}", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "-q",
            "--layout=tp32"]  # fmt: skip


def _run_with_fault(
    ssh_hosts,
    tmp_path: Path,
    cluster: Path,
    when: Callable[[], bool],
    fault: Callable[[], None],
    timeout_s: float = 420,
) -> tuple[int, str]:
    """Run the perf tests in the hub; call ``fault()`` once ``when()`` holds; wait for the end.
    A run that does not end in time is stopped with SIGTERM (it tears down) and fails."""
    log = tmp_path / "pytest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(ssh_hosts.in_hub(_argv(cluster, tmp_path / "out")), cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout_s
            while not when():
                text = log.read_text(errors="replace")[-4000:]
                assert proc.poll() is None, f"ended before the fault:\n{text}"
                assert time.monotonic() < deadline, f"no moment for the fault:\n{text}"
                time.sleep(0.05)
            fault()
            code = proc.wait(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=300)
                proc.kill()
    return code, log.read_text(errors="replace")


def _remote_logs(data: dict, name: str) -> list[Path]:
    """The node's process logs where it writes them (the test hosts share our file system)."""
    return list(Path(data["work_dir"]).glob(f"*/tp32/*{name}.log"))


def _log_has(data: dict, name: str, text: str) -> bool:
    return any(text in p.read_text(errors="replace") for p in _remote_logs(data, name))


def _measured(out: Path) -> bool:
    partial = list(out.glob("*/tp32/records.partial.jsonl"))
    lines = partial[0].read_text().splitlines() if partial else []
    return any(x.endswith("}") and json.loads(x)["index"] >= 0 for x in lines)


def _outage(ssh_hosts, name: str) -> Callable[[], None]:
    host = ssh_hosts.host(name)

    def fault() -> None:
        ssh_hosts.set_link(host, False)
        try:
            time.sleep(OUTAGE_S)  # the fault itself: the link is down this long
        finally:
            ssh_hosts.set_link(host, True)

    return fault


def _kill_everything(ssh_hosts) -> None:
    for host in ssh_hosts.hosts:
        ssh_hosts.set_link(host, True)
        for pid in ssh_hosts.pids(host) if host.running else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_15s_link_outage_during_start_up_is_survived(ssh_hosts, tmp_path):
    # every server "loads" for 30 s after its "Load weight end": the outage lands inside
    cluster, data = _yaml(ssh_hosts, tmp_path, startup_stall_s=120)
    data["server"]["args"]["mock-startup-delay"] = 30
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        code, text = _run_with_fault(ssh_hosts, tmp_path, cluster,
                                     lambda: _log_has(data, "node603", "Load weight end"),
                                     _outage(ssh_hosts, "node603"))  # fmt: skip
        assert code == 0, text[-5000:]
        assert "5 passed" in text
        assert "processes left running" not in text
        [run] = list((tmp_path / "out").iterdir())
        summary = json.loads((run / "tp32" / "summary.json").read_text())
        assert summary["complete"] is True and summary["completed"] == 8
        _assert_no_processes(ssh_hosts)
    finally:
        _kill_everything(ssh_hosts)


def test_a_15s_link_outage_of_a_rank_1_node_during_the_run_is_survived(ssh_hosts, tmp_path):
    # node603 is replica 0's rank 2: its mock keeps serving (rank 0's link to it is TCP, which
    # outlives 15 s), the executor reconnects and the watchdog's polls wait for it: the run
    # measures DP2 to the end and passes
    cluster, data = _yaml(ssh_hosts, tmp_path)
    data["mock"]["time_scale"] = 10
    data["workload"]["num_requests"] = 16
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    try:
        code, text = _run_with_fault(ssh_hosts, tmp_path, cluster, lambda: _measured(out),
                                     _outage(ssh_hosts, "node603"))  # fmt: skip
        assert code == 0, text[-5000:]
        assert "5 passed" in text and "watchdog" not in text
        assert "processes left running" not in text
        [run] = list(out.iterdir())
        summary = json.loads((run / "tp32" / "summary.json").read_text())
        assert summary["complete"] is True and summary["completed"] == 16
        _assert_no_processes(ssh_hosts)
    finally:
        _kill_everything(ssh_hosts)


def test_a_node_rebooted_mid_run_fails_the_run_naming_it_and_the_next_run_passes(
    ssh_hosts, tmp_path
):
    cluster, data = _yaml(ssh_hosts, tmp_path)
    data["mock"]["time_scale"] = 10
    data["workload"]["num_requests"] = 16
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    host = ssh_hosts.host("node605")  # replica 1's rank 0
    out = tmp_path / "out"

    def reboot() -> None:  # everything but sshd killed, its files in the run folder gone
        for pid in ssh_hosts.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in Path(data["work_dir"]).glob("*/tp32/*node605*"):
            path.unlink(missing_ok=True)

    try:
        code, text = _run_with_fault(ssh_hosts, tmp_path, cluster, lambda: _measured(out),
                                     reboot)  # fmt: skip
        assert code == 1, text[-5000:]
        assert "watchdog: replica1-node0-node605 (replica 1, node node605" in text, text[-5000:]
        assert "processes left running" not in text
        _assert_no_processes(ssh_hosts)

        data["mock"]["time_scale"] = 100
        data["workload"]["num_requests"] = 8
        cluster.write_text(yaml.safe_dump(data, sort_keys=False))
        again = _run_in_hub(ssh_hosts, tmp_path / "again", cluster, "--layout=tp32")
        assert again.returncode == 0, again.stdout[-4000:]
        _assert_no_processes(ssh_hosts)
    finally:
        _kill_everything(ssh_hosts)


def test_a_start_up_that_stalls_over_ssh_names_the_node_with_every_tail(ssh_hosts, tmp_path):
    cluster, _ = _yaml(ssh_hosts, tmp_path, node_env={"node605": {"KIMI_MOCK_STARTUP_STALL": "1"}},
                       startup_stall_s=6)  # fmt: skip
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
        text = done.stdout
        assert done.returncode == 1, text[-4000:]
        assert "replica1-node0-node605 (replica 1 node node605" in text, text[-4000:]
        assert "stalled: its log has not grown for" in text
        assert "last lines of every other process" in text
        for other in ("node601", "node604", "node608"):  # every node's tail, by name
            assert f" on {other} (" in text
        _assert_no_processes(ssh_hosts)
    finally:
        _kill_everything(ssh_hosts)
