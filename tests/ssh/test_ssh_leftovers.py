"""Processes an earlier run left on the nodes, on 8 SSH test hosts in namespaces.

A harness SIGKILLed mid-run cannot stop anything: its processes live on (up to the cluster's
``deployment_max_s``). The next run lists them and refuses to start; ``--kimi-reap`` stops
them and the run passes. A pid whose recorded boot id is not the node's (as after a reboot,
when the pid may name anyone's process) is never listed or touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import yaml
from test_ssh_deploy import PERF, ROOT, _assert_no_processes, _cluster_yaml, _run_in_hub

from pytest_kimi.config import Node
from pytest_kimi.deploy import leftovers, remote
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.testing.processes import pytest_argv, signal_when


def _kill_everything(ssh_hosts) -> None:
    """Whatever a failed test left on the hosts (root: the hosts' pids are ours to see)."""
    for host in ssh_hosts.hosts:
        for pid in ssh_hosts.pids(host) if host.running else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _measured(out: Path) -> bool:
    partial = list(out.glob("*/tp32/records.partial.jsonl"))
    lines = partial[0].read_text().splitlines() if partial else []
    return any(x.endswith("}") and json.loads(x)["index"] >= 0 for x in lines)


def test_a_sigkilled_harness_leaves_processes_the_next_run_refuses_and_reap_stops(
    ssh_hosts, tmp_path
):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    data["mock"]["time_scale"] = 10  # a run long enough to land in
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    first = tmp_path / "first"
    argv = [*pytest_argv(), str(PERF), f"--cluster={cluster}",
            f"--kimi-report-dir={first}", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "-q",
            "--layout=tp32"]  # fmt: skip
    try:
        code, text = signal_when(ssh_hosts.in_hub(argv), tmp_path / "first.log",
                                 lambda log: _measured(first), signal.SIGKILL, cwd=ROOT,
                                 timeout_s=120)  # fmt: skip
        assert code == -signal.SIGKILL, text[-3000:]
        # nothing stopped them: every host still runs its server (node601 the router too)
        assert all(ssh_hosts.pids(host) for host in ssh_hosts.hosts)

        data["mock"]["time_scale"] = 100
        cluster.write_text(yaml.safe_dump(data, sort_keys=False))
        refused = _run_in_hub(ssh_hosts, tmp_path / "second", cluster, "--layout=tp32")
        assert refused.returncode == 1, refused.stdout[-3000:]
        assert "process group(s) of earlier runs" in refused.stdout
        assert "pass --kimi-reap" in refused.stdout
        for name in ("node601", "node608"):
            assert f"node {name} (" in refused.stdout
        assert "router, pgid" in refused.stdout and "tp32, replica1-node3-node608" in refused.stdout
        assert all(ssh_hosts.pids(host) for host in ssh_hosts.hosts)  # refused, not touched

        reaped = _run_in_hub(ssh_hosts, tmp_path / "third", cluster, "--layout=tp32",
                             "--kimi-reap")  # fmt: skip
        assert reaped.returncode == 0, reaped.stdout[-4000:]
        assert "--kimi-reap stopped 9 process group(s) of earlier runs" in reaped.stdout
        _assert_no_processes(ssh_hosts)
    finally:
        _kill_everything(ssh_hosts)


def _ssh(ssh_hosts, host, command: str) -> str:
    done = ssh_hosts.run_in_hub(ssh_hosts.ssh_argv(host, command), timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_pid_recorded_under_another_boot_is_never_listed_or_touched(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    work = yaml.safe_load(cluster.read_text())["work_dir"]
    host = ssh_hosts.host("node603")
    spec = ProcessSpec("replica0-node2-node603", Node("node603", host.address, 8), ("sleep", "300"))
    files = remote.RemoteFiles.of(f"{work}/19990101-old/tp32", spec)
    try:
        command = remote.mkdir(f"{work}/19990101-old/tp32") + "; " + remote.start(spec, files)
        pgid = remote.parse_pid(_ssh(ssh_hosts, host, command))
        assert pgid is not None
        node = Node("node603", host.address, 8)
        found, _ = leftovers.parse_scan(
            node, work, _ssh(ssh_hosts, host, leftovers.scan_command(work))
        )
        assert [(f.run, f.pid) for f in found] == [("19990101-old/tp32", pgid)]  # as recorded: ours
        ident = Path(files.ident)  # the test hosts share this file system with us
        _, start, name = ident.read_text().split()
        assert name == "node603"
        ident.write_text(f"00000000-0000-4000-8000-000000000000\n{start}\n{name}\n")  # "rebooted"

        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32", "--kimi-reap")
        assert done.returncode == 0, done.stdout[-4000:]
        assert "earlier runs" not in done.stdout  # neither refused nor reaped
        assert remote.any_alive(_ssh(ssh_hosts, host, remote.group_stats(pgid)))  # untouched
    finally:
        _kill_everything(ssh_hosts)
