"""Nodes that are ours alone: two runs racing for the same 8 SSH test hosts.

The second run is refused at once, naming a node and the run that holds it; the first passes;
the lock goes with the first run (a third taker gets it) and with a SIGKILLed holder (its SSH
connection closes, so the remote ``flock`` ends).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from test_ssh_deploy import PERF, ROOT, _assert_no_processes, _cluster_yaml

from pytest_kimi.testing.processes import pytest_argv

# Takes every node's lock (as a run does), says so, then holds it until stdin ends or it is
# killed; exit 75 with the refusal when another holds a node.
TAKER = """
import sys
from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.locks import NodeBusy, NodeLocks, lock_dir, owner_line
cluster = load_cluster(sys.argv[1])
locks = NodeLocks(cluster.nodes, lock_dir(cluster), owner_line(sys.argv[2]))
try:
    locks.acquire()
except NodeBusy as exc:
    print("refused:", exc, flush=True)
    sys.exit(75)
print("held", flush=True)
sys.stdin.read()
locks.release()
print("released", flush=True)
"""


# Takes every lock with a 1 s wait for EOF at release; says each step; releases on a line of
# stdin and prints the holders it could not confirm ended.
SLOW_RELEASE = """
import json, sys
from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.locks import NodeLocks, lock_dir, owner_line
cluster = load_cluster(sys.argv[1])
locks = NodeLocks(cluster.nodes, lock_dir(cluster), owner_line("slow-eof"), eof_s=1.0,
                  say=lambda message: print("say:", message, flush=True))
locks.acquire()
print("held", flush=True)
sys.stdin.readline()
print("left:", json.dumps(locks.release()), flush=True)
"""


def _take(ssh_hosts, cluster: Path, run_id: str, **kwargs) -> subprocess.CompletedProcess:
    """Take every lock and give it back at once (stdin is empty)."""
    argv = [sys.executable, "-c", TAKER, str(cluster), run_id]
    return ssh_hosts.run_in_hub(argv, timeout=60, cwd=ROOT, input="", **kwargs)


def _pytest(cluster: Path, out: Path) -> list[str]:
    return [
        *pytest_argv(), str(PERF), f"--cluster={cluster}",
        f"--kimi-report-dir={out}", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "-v",
        "--layout=tp32",
    ]  # fmt: skip


def test_a_second_run_on_locked_nodes_is_refused_at_once_naming_node_and_holder(
    ssh_hosts, tmp_path
):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    data["mock"]["time_scale"] = 5  # the first run is still measuring when the second starts
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    first_log = tmp_path / "first.log"
    with first_log.open("wb") as sink:
        first = subprocess.Popen(ssh_hosts.in_hub(_pytest(cluster, tmp_path / "first")),
                                 cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "bringing up" not in first_log.read_text():  # past the locks
                assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()
                time.sleep(0.05)
            second = ssh_hosts.run_in_hub(_pytest(cluster, tmp_path / "second"), timeout=120,
                                          cwd=ROOT)  # fmt: skip
            first_still_running = first.poll() is None
            first_code = first.wait(timeout=300)
        finally:
            if first.poll() is None:
                first.kill()
    text = first_log.read_text()
    assert first_code == 0, text[-4000:]  # the first run passes, undisturbed
    assert first_still_running  # refused at once, not after waiting for the first run
    assert second.returncode == 1, second.stdout[-4000:]
    assert "bringing up" not in second.stdout  # nothing of the second run started
    [run] = list((tmp_path / "first").iterdir())
    [refused] = list((tmp_path / "second").iterdir())
    error = json.loads((refused / "tp32" / "summary.json").read_text())["error"]
    assert "NodeBusy: node node60" in error and "is in use by another run: user=" in error
    assert f"run={run.name}/tp32 " in error and " since=" in error, error
    _assert_no_processes(ssh_hosts)
    third = _take(ssh_hosts, cluster, "third")  # released with the first run
    assert third.returncode == 0 and "held" in third.stdout, third.stdout + third.stderr
    _assert_no_processes(ssh_hosts)


def test_the_lock_goes_with_a_sigkilled_holder(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    argv = ssh_hosts.in_hub([sys.executable, "-c", TAKER, str(cluster), "killed-run"])
    holder = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = _take(ssh_hosts, cluster, "second")
        assert refused.returncode == 75, refused.stdout + refused.stderr
        assert "refused: node node601" in refused.stdout
        assert f"run=killed-run pid={holder.pid} " in refused.stdout  # `ip netns exec` execs
        holder.kill()  # SIGKILL: no release, no goodbye; the kernel closes its connections
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
    deadline = time.monotonic() + 30  # sshd notices the closed connection at once
    while (later := _take(ssh_hosts, cluster, "later")).returncode == 75:
        assert time.monotonic() < deadline, later.stdout
        time.sleep(0.2)
    assert later.returncode == 0 and "held" in later.stdout, later.stdout + later.stderr
    _assert_no_processes(ssh_hosts)


def test_a_holder_whose_eof_is_held_up_by_a_link_outage_is_ended_at_release(ssh_hosts, tmp_path):
    # the EOF to node603's holder waits out TCP's back-off behind the dead link: release ends
    # that holder over a new connection once the link is back, and no process is left
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    node = ssh_hosts.host("node603")
    argv = ssh_hosts.in_hub([sys.executable, "-c", SLOW_RELEASE, str(cluster)])
    taker = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    said: list[str] = []
    try:
        assert taker.stdin is not None and taker.stdout is not None
        assert taker.stdout.readline() == "held\n"
        ssh_hosts.set_link(node, False)
        taker.stdin.write("release\n")
        taker.stdin.flush()
        while not (line := taker.stdout.readline()).startswith("say:"):
            assert line, "the taker ended without ending the slow holder"
        said.append(line)  # its EOF is overdue: the link comes back, the new connection works
        ssh_hosts.set_link(node, True)
        while not (line := taker.stdout.readline()).startswith("left:"):
            assert line, "the taker ended before its release returned"
            said.append(line)
        assert taker.wait(timeout=30) == 0
    finally:
        ssh_hosts.set_link(node, True)
        if taker.poll() is None:
            taker.kill()
    assert json.loads(line.removeprefix("left:")) == []
    assert len(said) == 1 and "lock holder on node603 " in said[0], said
    assert "no answer to EOF in 1s" in said[0]
    _assert_no_processes(ssh_hosts)  # at once: not when TCP's back-off lets the EOF through
