"""Node addresses, socket interfaces, the network pre-flight's probes, the router's
benchmarking defaults and version check (issue 15 items 1 and 6), without any network."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
from pathlib import Path

import pytest

from pytest_kimi.config import ClusterConfig, NetworkConfig, Node, load_cluster
from pytest_kimi.deploy import network
from pytest_kimi.deploy.listing import describe
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.report.routermetrics import notes
from pytest_kimi.testing.processes import pytest_argv

ROOT = Path(__file__).resolve().parents[2]
PRO6000 = ROOT / "clusters" / "pro6000.yaml"


@pytest.fixture(scope="module")
def pro6000() -> ClusterConfig:
    return load_cluster(PRO6000)


def _no_addr(cluster: ClusterConfig) -> ClusterConfig:
    nodes = tuple(dataclasses.replace(n, addr=None) for n in cluster.nodes)
    return dataclasses.replace(cluster, nodes=nodes)


class Answers:
    """An executor whose nodes answer from a table: node name -> (exit, output)."""

    def __init__(self, answers: dict[str, tuple[int, str]], version: str | None = "0.3.2"):
        self.answers, self.version, self.asked = answers, version, []

    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]:
        self.asked.append((node.name, command))
        return self.answers[node.name]

    def run_as(self, spec, command, timeout=None):
        return 0, '{"python": "3.11", "sglang_router": %s}' % (
            "null" if self.version is None else f'"{self.version}"'
        )


# --------------------------------------------------------------------- plan and dry run


def test_plan_binds_addresses_and_peers_on_the_head_addr(pro6000: ClusterConfig) -> None:
    plan = plan_deployment(pro6000, pro6000.layout("pp8"))
    for spec in plan.servers:
        argv = spec.argv
        assert argv[argv.index("--host") + 1] == spec.node.addr  # 10.0.0.x, not node60x
        head = "10.0.0.1" if spec.replica == 0 else "10.0.0.5"
        assert argv[argv.index("--dist-init-addr") + 1] == f"{head}:5757"
        assert spec.env["GLOO_SOCKET_IFNAME"] == spec.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert plan.endpoint == "http://10.0.0.1:30000"
    assert plan.router_metrics_url == "http://10.0.0.1:29000/metrics"
    assert "http://10.0.0.5:30001" in plan.router.argv


def test_resolved_addresses_fill_nodes_without_addr(pro6000: ClusterConfig) -> None:
    cluster = _no_addr(pro6000)
    unresolved = plan_deployment(cluster, cluster.layout("tp32"))
    assert "--host node602" in unresolved.servers[1].command_line()
    assert "no addr set, resolved on the node at bring-up" in describe(unresolved)
    addrs = {f"node60{i}": f"192.168.7.{i}" for i in range(1, 9)}
    plan = plan_deployment(cluster, cluster.layout("tp32"), addrs=addrs)
    assert "--host 192.168.7.2" in plan.servers[1].command_line()
    assert "--dist-init-addr 192.168.7.5:5757" in plan.servers[5].command_line()
    assert plan.endpoint == "http://192.168.7.1:30000"


def test_socket_interface_is_overridable_by_server_and_node_env(pro6000: ClusterConfig) -> None:
    server = dataclasses.replace(pro6000.server, env={"NCCL_SOCKET_IFNAME": "ib0"})
    nodes = (dataclasses.replace(pro6000.nodes[0], env={"GLOO_SOCKET_IFNAME": "bond0"}),)
    cluster = dataclasses.replace(pro6000, server=server, nodes=nodes + pro6000.nodes[1:])
    plan = plan_deployment(cluster, cluster.layout("tp32"))
    first, second = plan.servers[0].env, plan.servers[1].env
    assert (first["GLOO_SOCKET_IFNAME"], first["NCCL_SOCKET_IFNAME"]) == ("bond0", "ib0")
    assert (second["GLOO_SOCKET_IFNAME"], second["NCCL_SOCKET_IFNAME"]) == ("eth0", "ib0")
    assert NetworkConfig().socket_env() == {}


def test_dry_run_of_pro6000_shows_addresses_interfaces_and_router_settings() -> None:
    done = subprocess.run(
        [*pytest_argv(), str(ROOT / "tests" / "perf"), f"--cluster={PRO6000}",
         "--kimi-dry-run", "--layout=tp32", "-p", "no:cacheprovider", f"--rootdir={ROOT}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-2000:] + done.stderr[-2000:]
    assert "replica1-node1-node606 on node606 (ssh node606, addr 10.0.0.6)" in out
    assert "--dist-init-addr 10.0.0.5:5757 --host 10.0.0.6 " in out
    assert "GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0" in out
    assert "--worker-urls http://10.0.0.1:30001 http://10.0.0.5:30001" in out
    for flag in ("--disable-retries", "--disable-circuit-breaker",
                 "--health-check-timeout-secs 60", "--health-failure-threshold 10"):  # fmt: skip
        assert flag in out


# ------------------------------------------------------------------- router arguments


def test_false_removes_a_default_from_the_router_argv(pro6000: ClusterConfig) -> None:
    router = dataclasses.replace(pro6000.router, args={"disable-retries": False})
    plan = plan_deployment(dataclasses.replace(pro6000, router=router), pro6000.layout("tp32"))
    assert "--disable-retries" not in plan.router.argv
    assert "--disable-circuit-breaker" in plan.router.argv


def test_router_metrics_without_known_counters_are_said_unavailable() -> None:
    old = {("sgl_router_retries_total", ""): 3.0}  # an older router's names: not read
    (note,) = notes({}, {})
    assert note.startswith("router metrics unavailable") and "smg_worker_retries_total" in note
    assert notes({}, old)[0].startswith("router metrics unavailable")
    assert notes({}, {("smg_router_upstream_responses_total", "200"): 4.0}) == []


# --------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("addr", "loopback"),
    [("127.0.1.1", True), ("::1", True), ("127.0.0.1", True), ("10.0.0.1", False),
     ("node601", False)],
)  # fmt: skip
def test_is_loopback(addr: str, loopback: bool) -> None:
    assert network.is_loopback(addr) is loopback


def test_resolve_command_runs_in_a_shell() -> None:
    text = subprocess.run(
        ["sh", "-c", network.resolve_command("localhost", None)],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    hostname, addr = network.read_resolved(text)
    assert hostname == socket.gethostname() and addr == "127.0.0.1"


def test_a_node_resolving_to_loopback_is_refused_naming_it(pro6000: ClusterConfig) -> None:
    cluster = _no_addr(pro6000)
    answers = {f"node60{i}": (0, f"@@kimi-net hostname node60{i}\n@@kimi-net addr 10.9.0.{i}\n")
               for i in range(1, 9)}  # fmt: skip
    executor = Answers(answers)
    got = network.node_addresses(cluster, executor)  # type: ignore[arg-type]
    assert got == {f"node60{i}": f"10.9.0.{i}" for i in range(1, 9)}
    assert "ip -4 -o addr show dev eth0" in executor.asked[0][1]  # network.interface is set
    answers["node603"] = (0, "@@kimi-net hostname node603\n@@kimi-net addr 127.0.1.1\n")
    answers["node607"] = (2, "@@kimi-net hostname node607\n@@kimi-net addr\n")
    with pytest.raises(network.NetworkError) as caught:
        network.node_addresses(cluster, Answers(answers))  # type: ignore[arg-type]
    text = str(caught.value)
    assert "2 problems; nothing was started" in text
    assert "node node603 (ssh node603): network.interface eth0 resolves to 127.0.1.1" in text
    assert "set addr:" in text and "node node607" in text and "no IPv4 address" in text


def test_explicit_loopback_addr_is_refused_without_asking(pro6000: ClusterConfig) -> None:
    nodes = (dataclasses.replace(pro6000.nodes[0], addr="127.0.1.1"), *pro6000.nodes[1:])
    executor = Answers({})
    with pytest.raises(network.NetworkError, match=r"node node601 .*127\.0\.1\.1 is a loopback"):
        network.node_addresses(dataclasses.replace(pro6000, nodes=nodes), executor)  # type: ignore[arg-type]
    assert executor.asked == []


def test_local_clusters_resolve_nothing() -> None:
    local = load_cluster(ROOT / "clusters" / "local.yaml")
    assert network.node_addresses(local, Answers({})) == {}  # type: ignore[arg-type]


# ------------------------------------------------------------------------ reachability


def test_probes_cover_peers_to_heads_router_to_heads_and_client_to_router(
    pro6000: ClusterConfig,
) -> None:
    plan = plan_deployment(pro6000, pro6000.layout("tp32"))
    got = {(p.source.name if p.source else None, p.target.name, p.addr, p.port)
           for p in network.probes(plan)}  # fmt: skip
    peers = {(f"node60{i}", "node601", "10.0.0.1", 5757) for i in (2, 3, 4)}
    peers |= {(f"node60{i}", "node605", "10.0.0.5", 5757) for i in (6, 7, 8)}
    router = {("node601", "node605", "10.0.0.5", 30001)}  # node601 is its own head: no probe
    client = {(None, "node601", "10.0.0.1", 30000)}
    assert got == peers | router | client


def test_refused_means_the_host_answered_and_timeout_does_not() -> None:
    text = "\n".join([
        "@@kimi-net 10.0.0.1 5757 1 Connection refused",
        "@@kimi-net 10.0.0.5 5757 124 ",
        "@@kimi-net 10.0.0.6 30001 1 No route to host",
        "@@kimi-net 10.0.0.7 30001 0 ",
    ])  # fmt: skip
    got = network.read_probes(text, 3.0)
    assert got[("10.0.0.1", 5757)] == "" and got[("10.0.0.7", 30001)] == ""
    assert got[("10.0.0.5", 5757)].startswith("no answer within 3 s")
    assert got[("10.0.0.6", 30001)] == "No route to host"


def test_probe_command_classifies_a_closed_local_port_as_reachable() -> None:
    with socket.socket() as sock:  # a port surely closed: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        target = Node("self", "127.0.0.1", 1)
        probe = network.Probe(target, target, "127.0.0.1", port, "a closed port")
        text = subprocess.run(["bash", "-c", network.probe_command([probe], 3.0)],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        assert network.read_probes(text, 3.0) == {("127.0.0.1", port): ""}, text
        assert network.from_here(probe, 3.0) == ""


def test_unreachable_lists_every_failed_probe_naming_both_nodes(
    pro6000: ClusterConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "from_here", lambda probe, timeout_s: "timed out")
    plan = plan_deployment(pro6000, pro6000.layout("tp32"))
    ok = "@@kimi-net 10.0.0.1 5757 1 Connection refused\n"
    answers = {f"node60{i}": (0, ok) for i in range(1, 9)}
    answers["node603"] = (0, "@@kimi-net 10.0.0.1 5757 1 No route to host\n")
    answers["node601"] = (0, "@@kimi-net 10.0.0.5 30001 124 \n")
    answers["node606"] = (0, "@@kimi-net 10.0.0.5 5757 1 Connection refused\n")
    answers["node607"] = answers["node608"] = answers["node606"]
    found = network.unreachable(plan, Answers(answers), 3.0)  # type: ignore[arg-type]
    assert (
        "node node603 cannot reach node node601 at 10.0.0.1 port 5757 "
        "(replica 0's dist-init port): No route to host"
    ) in found
    assert any(f.startswith("node node601 cannot reach node node605 at 10.0.0.5 port 30001")
               for f in found)  # fmt: skip
    assert any(f.startswith("this machine (pytest) cannot reach node node601") for f in found)
    assert len(found) == 3
