"""Addresses and the network pre-flight on the SSH test hosts (issue 15 item 1).

Every host resolves its own name to its address through ``/etc/netns/<ns>/hosts`` (bind-mounted
over ``/etc/hosts`` in the namespace, so rewriting the file in place changes what the node
answers). A node that resolves its name to loopback, as Debian's ``127.0.1.1 <hostname>`` line
makes it, is refused naming it; with ``addr`` set (and ``host`` the SSH name) the DP2 run
binds every server to its address; a peer whose route to its replica head is gone is named by
the pre-flight before anything starts.
"""

from __future__ import annotations

import json
import subprocess

import yaml
from test_ssh_deploy import _assert_no_processes, _cluster_yaml, _run_in_hub
from testhosts import ETC_NETNS


def test_a_node_resolving_its_name_to_loopback_is_refused_naming_it(ssh_hosts, tmp_path):
    victim = ssh_hosts.hosts[2]  # node603; no addr in the file: resolved on each node
    hosts_file = ETC_NETNS / victim.netns / "hosts"
    before = hosts_file.read_text()
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    lines = [ln for ln in before.splitlines() if not ln.endswith(f" {victim.name}")]
    hosts_file.write_text("\n".join([*lines, f"127.0.1.1 {victim.name}"]) + "\n")  # in place
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    finally:
        hosts_file.write_text(before)
    assert done.returncode == 1, done.stdout[-3000:]
    out = done.stdout
    assert "node node603 (ssh " in out and "its hostname node603 resolves to 127.0.1.1" in out
    assert "set addr:" in out and "node node602" not in out.split("address check")[1][:600]
    _assert_no_processes(ssh_hosts)


def test_dp2_with_addr_binds_every_server_to_its_address(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    for node, host in zip(data["nodes"], ssh_hosts.hosts, strict=True):
        node.update(host=host.name, addr=host.address)  # SSH by name, data by address
    data["network"] = {"interface": "eth0"}
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "network pre-flight: 8 connection(s) reachable" in done.stdout
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    manifest = json.loads((run / "tp32" / "manifest.json").read_text())
    commands = {p["name"]: p["command"] for p in manifest["processes"]}
    head = ssh_hosts.hosts[4].address
    for i, host in enumerate(ssh_hosts.hosts):
        replica, rank = divmod(i, 4)
        command = commands[f"replica{replica}-node{rank}-{host.name}"]
        assert f"--host {host.address} " in command
        assert "GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0" in command
        if replica == 1:
            assert f"--dist-init-addr {head}:5757" in command
    assert f"--host {ssh_hosts.hosts[0].address} " in commands["router"]
    assert "--disable-retries" in commands["router"]


def test_a_blocked_peer_is_named_by_the_network_preflight_before_anything_starts(
    ssh_hosts, tmp_path
):
    peer, head = ssh_hosts.hosts[1], ssh_hosts.hosts[0]  # node602 loses its route to node601
    route = ["ip", "-n", peer.netns, "route", "add", "unreachable", f"{head.address}/32"]
    subprocess.run(route, check=True, timeout=20)
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    finally:
        subprocess.run([*route[:4], "del", *route[5:]], check=True, timeout=20)
    assert done.returncode == 1, done.stdout[-3000:]
    assert (
        f"node node602 cannot reach node node601 at {head.address} port 5757 "
        "(replica 0's dist-init port)"
    ) in done.stdout
    assert "network pre-flight found 1 problem; nothing was started" in done.stdout
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    assert not list((run / "tp32" / "logs").glob("replica*.log"))  # no server was started
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert "NetworkError" in summary["error"]
