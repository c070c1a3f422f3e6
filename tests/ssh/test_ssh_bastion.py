"""A bastion as the only way in (issue 15 item 2), on the SSH test hosts.

The pytest child runs in the hub namespace, which routes to every host over the bridge. Here
every host but node601 gets a blackhole route in the hub (``ip route add blackhole ADDR/32``):
the hub's packets to them are dropped, while the hosts still reach each other over the bridge.
node601 is the jump host (``ssh.jump_host``); the router runs on node602, behind it.

With ``network.client: ssh_forward`` the DP2 run passes: health, readiness, warm-up,
versions, metrics, the watchdog and the benchmark go through local SSH forwards, which are
closed at teardown. With ``client: direct`` the network pre-flight fails at once, naming the
router's address, instead of a start-up that waits for a router nobody can reach.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest
import yaml
from test_ssh_deploy import _assert_no_processes, _cluster_yaml, _run_in_hub
from testhosts import _ip

BASTION = 0  # node601


def _hub_reaches(ssh_hosts, addr: str) -> bool:
    """A TCP connection from the hub to ``addr`` port 22 (sshd) within 2 s."""
    probe = ["timeout", "2", "bash", "-c", f"exec 3<>/dev/tcp/{addr}/22"]
    return ssh_hosts.run_in_hub(probe, timeout=20).returncode == 0


@pytest.fixture
def bastion_only(ssh_hosts) -> Iterator[str]:
    """Direct routes from the hub to every host but the bastion blocked; yields the bastion's
    address. Every route added is removed, whatever happens."""
    blocked = [h.address for i, h in enumerate(ssh_hosts.hosts) if i != BASTION]
    added: list[str] = []
    try:
        for addr in blocked:
            route = [_ip(), "-n", ssh_hosts.hub, "route", "add", "blackhole", f"{addr}/32"]
            subprocess.run(route, check=True, timeout=20)
            added.append(addr)
        bastion = ssh_hosts.hosts[BASTION].address
        assert _hub_reaches(ssh_hosts, bastion)
        assert not _hub_reaches(ssh_hosts, blocked[0])  # the blocking really blocks
        assert not _hub_reaches(ssh_hosts, blocked[-1])
        yield bastion
    finally:
        for addr in added:
            delete = [_ip(), "-n", ssh_hosts.hub, "route", "del", "blackhole", f"{addr}/32"]
            subprocess.run(delete, check=False, timeout=20)
    assert _hub_reaches(ssh_hosts, blocked[0])  # and the route is back


def _behind_bastion(ssh_hosts, tmp_path, bastion: str, client: str):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    data["ssh"]["jump_host"] = f"{ssh_hosts.user}@{bastion}:22"
    data["ssh"]["check_host_keys"] = True
    data["router"]["node"] = "node602"  # behind the bastion
    data["network"] = {"client": client}
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    return cluster


def test_ssh_forward_through_a_bastion_runs_dp2_and_leaves_nothing(
    ssh_hosts, tmp_path, bastion_only
):
    cluster = _behind_bastion(ssh_hosts, tmp_path, bastion_only, "ssh_forward")
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"network pre-flight: \d+ connection\(s\) reachable", out), out[-3000:]
    assert "SSH forward(s) closed" in out and "still open" not in out
    assert "processes left running" not in out
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["complete"] is True
    assert any("SSH forward" in note for note in summary["notes"])  # the latency caveat
    assert any(n.startswith("requests per replica: replica0") for n in summary["notes"])
    manifest = json.loads((run / "tp32" / "manifest.json").read_text())
    versions = [n.get("sglang_server_version") for n in manifest["nodes"]]
    assert any(versions)  # asked over HTTP, through a forward


def test_direct_client_behind_a_bastion_fails_fast_naming_the_router_address(
    ssh_hosts, tmp_path, bastion_only
):
    cluster = _behind_bastion(ssh_hosts, tmp_path, bastion_only, "direct")
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 1, done.stdout[-3000:]
    router = ssh_hosts.hosts[1].address
    assert (
        f"this machine (pytest) cannot reach node node602 at {router} port 30000 "
        "(the router's port)"
    ) in done.stdout
    assert "network: {client: ssh_forward}" in done.stdout
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    assert not list((run / "tp32" / "logs").glob("replica*.log"))  # nothing was started
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert "NetworkError" in summary["error"]


def test_client_on_a_node_behind_a_bastion_times_the_run_there_and_leaves_nothing(
    ssh_hosts, tmp_path, bastion_only
):
    # the client runs on node606 (behind the bastion, not the router's node), shipped as a
    # zip; the control plane still goes through the forwards
    cluster = _behind_bastion(ssh_hosts, tmp_path, bastion_only, "on_node")
    data = yaml.safe_load(cluster.read_text())
    data["network"]["client_node"] = "node606"
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "processes left running" not in done.stdout
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["complete"] is True
    [note] = [n for n in summary["notes"] if n.startswith("network.client: on_node")]
    router = ssh_hosts.hosts[1].address
    assert f"timed on node node606, to the router at http://{router}:30000" in note
    assert re.search(r"node clock offset [+-]\d+\.\d{3} s ± \d+ ms", note), note
    # what was measured is what the client on node606 wrote (the hosts share our disk)
    [events] = list((tmp_path / "remote").glob("*/tp32/client2-node606.events.jsonl"))
    sent = [json.loads(x)["record"]["request_id"] for x in events.read_text().splitlines()
            if '"event":"done"' in x]  # fmt: skip
    records = [json.loads(x) for x in (run / "tp32" / "records.jsonl").read_text().splitlines()]
    assert sorted(sent) == sorted(r["request_id"] for r in records if not r["warmup"])
    assert (run / "tp32" / "logs" / "client2-node606.log").exists()
