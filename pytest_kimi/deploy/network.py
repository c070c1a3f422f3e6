"""The data network: each node's address, resolved on the node, and a reachability pre-flight.

A node's ``host`` is where SSH goes; its ``addr`` is where its server listens and where peers,
the router and the client connect. Left out, ``addr`` is resolved ON the node at bring-up (what
the node itself would answer, not what the pytest machine's resolver or ``~/.ssh/config`` says):
``network.interface``'s IPv4 address when the file names the data interface, else the first
IPv4 address ``getent ahostsv4 $(hostname)`` gives (what Gloo and torch use when nothing
pins them). ``hostname -I`` is not used: on a node with Ethernet, InfiniBand and docker0 it
lists them all with nothing saying which is the data network. A loopback answer (Debian's
``127.0.1.1 <hostname>`` line) is refused, naming the node: peers cannot reach it there.

Then, in seconds and before anything starts, every peer node tries a TCP connection to its
replica head's dist-init port, the router's node to each replica head's HTTP port, and this
machine to the router's port. Nothing listens yet, so a probe passes when the target host
ANSWERS: "connection refused" (the host sent a reset: it is there at that address) or a
connection. A time-out, "no route to host" or "network unreachable" fails it, naming both
nodes and the port. That catches dropped packets, missing routes, a wrong subnet and a dead
link; it cannot tell a firewall that REJECTs the one port (that looks like "refused"). Nodes
probe in parallel, one round trip each, like the GPU pre-flight (deploy/preflight.py).

Local clusters run everything on this machine's loopback: neither step applies.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pytest_kimi.config.cluster import SUBMIT_HOST

if TYPE_CHECKING:
    from pytest_kimi.config import ClusterConfig, Layout, Node
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.deploy.plan import DeploymentPlan

MARK = "@@kimi-net"
DISABLE_HINT = "or turn the probes off with `network: {preflight: false}` in the cluster file"
T = TypeVar("T")
R = TypeVar("R")


class NetworkError(RuntimeError):
    """A node's address is unusable, or a node cannot reach another: nothing was started."""


def is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return False
    return True


def is_loopback(addr: str) -> bool:
    """127.0.0.0/8 and ::1 (a name is not an address: False)."""
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- addresses


def resolve_command(name: str | None, interface: str | None) -> str:
    """Print ``@@kimi-net hostname H`` and ``@@kimi-net addr A`` (A empty when nothing
    resolved): ``name`` resolved, or the interface's IPv4 address, or the node's hostname's."""
    if name is not None:
        find = f"getent ahostsv4 {shlex.quote(name)} | awk '{{print $1; exit}}'"
    elif interface is not None:
        find = (
            f"ip -4 -o addr show dev {shlex.quote(interface)} 2>/dev/null"
            " | awk '{split($4, a, \"/\"); print a[1]; exit}'"
        )
    else:
        find = "getent ahostsv4 \"$(hostname)\" | awk '{print $1; exit}'"
    return f'echo "{MARK} hostname $(hostname)"; echo "{MARK} addr $({find})"'


def read_resolved(text: str) -> tuple[str, str]:
    """``(hostname, address)`` from :func:`resolve_command`'s output ('' when absent)."""
    found = {"hostname": "", "addr": ""}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == MARK and parts[1] in found:
            found[parts[1]] = parts[2] if len(parts) > 2 else ""
    return found["hostname"], found["addr"]


def address_problem(node: Node, interface: str | None, code: int, text: str) -> tuple[str, str]:
    """``(address, problem)`` of one node from its answer; exactly one of them is ''."""
    hostname, addr = read_resolved(text)
    where = f"node {node.name} (ssh {node.host})"
    asked = (
        f"addr {node.addr}"
        if node.addr is not None
        else f"network.interface {interface}"
        if interface is not None
        else f"its hostname {hostname or '?'}"
    )
    if not addr:
        return "", (
            f"{where}: {asked} resolves to no IPv4 address on the node (exit {code}: "
            f"{text.strip()[-200:] or 'no output'}); set addr: for this node in the cluster file"
        )
    if is_loopback(addr):
        return "", (
            f"{where}: {asked} resolves to {addr} on the node, a loopback address: peers and the "
            "router cannot reach a server bound there; set addr: <its data-network address> "
            "for this node (or network.interface) in the cluster file"
        )
    return addr, ""


def node_addresses(
    cluster: ClusterConfig, executor: Executor, layout: Layout | None = None
) -> dict[str, str]:
    """``node name -> address`` for the nodes whose address had to be resolved on the node
    (``addr`` absent); every node's address checked not loopback. Raises one
    :class:`NetworkError` listing every problem. Local clusters: ``{}`` (loopback is right)."""
    if not cluster.remote:
        return {}
    interface = cluster.network.interface
    problems: list[str] = []
    ask: list[Node] = []
    for node in cluster.deployment_nodes(layout):
        if node.name == SUBMIT_HOST:  # slurm.router: submit_host: the router is here
            continue
        if node.addr is not None and is_ip(node.addr):
            if is_loopback(node.addr):
                problems.append(
                    f"node {node.name} (ssh {node.host}): addr {node.addr} is a loopback address:"
                    " peers and the router cannot reach it; give its data-network address"
                )
        else:
            ask.append(node)

    def one(node: Node) -> tuple[str, str]:
        name = node.addr  # a name: resolved on the node too, checked, and kept as written
        try:
            code, text = executor.run(node, resolve_command(name, interface), 30)
        except Exception as exc:  # NodeError: unreachable
            return "", f"node {node.name}: its address could not be asked: {exc}"
        return address_problem(node, interface, code, text)

    resolved: dict[str, str] = {}
    for node, (addr, problem) in zip(ask, _parallel(one, ask), strict=True):
        if problem:
            problems.append(problem)
        elif node.addr is None:
            resolved[node.name] = addr
    _raise("address check", problems, "")
    return resolved


# ------------------------------------------------------------------------- reachability


@dataclass(frozen=True)
class Probe:
    """One TCP connection to try: from ``source`` (None: this machine) to ``target``."""

    source: Node | None
    target: Node
    addr: str
    port: int
    what: str  # "replica 0's dist-init port", for the message

    def problem(self, why: str) -> str:
        src = f"node {self.source.name}" if self.source is not None else "this machine (pytest)"
        return (
            f"{src} cannot reach node {self.target.name} at {self.addr} port {self.port} "
            f"({self.what}): {why}"
        )


def probes(plan: DeploymentPlan) -> list[Probe]:
    """Every connection the deployment will make between nodes, and the client's."""
    out: list[Probe] = []
    heads = {s.replica: s for s in plan.rank0()}
    for spec in plan.servers:
        head = heads[spec.replica]
        if spec.rank and spec.node.name != head.node.name:
            port = int(spec.argv[spec.argv.index("--dist-init-addr") + 1].rsplit(":", 1)[1])
            what = f"replica {spec.replica}'s dist-init port"
            out.append(Probe(spec.node, head.node, head.bind_addr, port, what))
    router = plan.router
    for head in heads.values():
        if head.node.name != router.node.name:
            what = f"replica {head.replica}'s HTTP port, for the router"
            out.append(Probe(router.node, head.node, head.bind_addr, head.port, what))
    out.append(Probe(None, router.node, router.bind_addr, router.port, "the router's port"))
    client = _client_node(plan)
    if client is not None and client.name != router.node.name:
        what = "the router's port, for the benchmark client (network.client: on_node)"
        out.append(Probe(client, router.node, router.bind_addr, router.port, what))
    return out


def _client_node(plan: DeploymentPlan) -> Node | None:
    """The node the benchmark client runs on (``network.client: on_node``), else None."""
    network = plan.cluster.network
    if network.client != "on_node":
        return None
    return next(n for n in plan.cluster.nodes if n.name == network.client_node)


def probe_command(targets: Sequence[Probe], timeout_s: float) -> str:
    """Bash, one line per target: ``@@kimi-net ADDR PORT EXIT MESSAGE`` (all in parallel)."""
    connect = 'exec 3<>"/dev/tcp/$0/$1"'
    lines = [
        "probe() { out=$(timeout " + f"{timeout_s:g}" + f" bash -c {shlex.quote(connect)} "
        '"$1" "$2" 2>&1); echo "' + MARK + ' $1 $2 $? ${out##*: }"; }'
    ]
    lines += [f"probe {shlex.quote(t.addr)} {t.port} &" for t in targets]
    lines.append("wait")
    return "\n".join(lines)


def verdict(code: int, message: str, timeout_s: float) -> str:
    """'' when the target answered (connected, or refused: the host is there), else why not."""
    if code == 0 or "refused" in message.lower():
        return ""
    if code == 124:
        return f"no answer within {timeout_s:g} s (packets dropped, or no such host)"
    return message.strip() or f"exit {code}"


def read_probes(text: str, timeout_s: float) -> dict[tuple[str, int], str]:
    """``(addr, port) -> ''`` or why it was not reached, from :func:`probe_command`'s output."""
    out: dict[tuple[str, int], str] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=4)
        if len(parts) >= 4 and parts[0] == MARK and parts[2].isdigit() and parts[3].isdigit():
            message = parts[4] if len(parts) > 4 else ""
            out[(parts[1], int(parts[2]))] = verdict(int(parts[3]), message, timeout_s)
    return out


def from_here(probe: Probe, timeout_s: float) -> str:
    """The client's probe, from this machine: '' when the host answered."""
    try:
        with socket.create_connection((probe.addr, probe.port), timeout=timeout_s):
            return ""
    except ConnectionRefusedError:
        return ""
    except TimeoutError:
        return f"no answer within {timeout_s:g} s (packets dropped, or no such host)"
    except OSError as exc:
        return exc.strerror or str(exc)


def unreachable(
    plan: DeploymentPlan,
    executor: Executor,
    timeout_s: float,
    client_probe: Callable[[Probe, float], str] | None = None,
) -> list[str]:
    """Every probe of :func:`probes` that failed, as a line naming both ends and the port.
    ``client_probe``: how this machine's probe is made (``Reach.probe``: through the SSH
    forward in ``network.client: ssh_forward``; default :func:`from_here`)."""
    todo = probes(plan)
    by_source: dict[str, list[Probe]] = {}
    for probe in todo:
        if probe.source is not None:
            by_source.setdefault(probe.source.name, []).append(probe)

    def one(group: list[Probe]) -> list[str]:
        node = group[0].source
        assert node is not None
        try:
            _, text = executor.run(node, probe_command(group, timeout_s), timeout_s + 30)
        except Exception as exc:  # NodeError
            return [f"node {node.name}: the network probes could not be run: {exc}"]
        answers = read_probes(text, timeout_s)
        missing = "no answer from the probe (bash and timeout on the node?)"
        return [
            p.problem(answers.get((p.addr, p.port), missing))
            for p in group
            if answers.get((p.addr, p.port), missing)
        ]

    found = [line for lines in _parallel(one, list(by_source.values())) for line in lines]
    found += [
        p.problem(why)
        for p in todo
        if p.source is None
        if (why := (client_probe or from_here)(p, timeout_s))
    ]
    return found


def check_reachable(
    plan: DeploymentPlan,
    executor: Executor,
    client_probe: Callable[[Probe, float], str] | None = None,
) -> int:
    """Run the probes of an ssh cluster's plan; one :class:`NetworkError` lists every failed
    one. Returns how many were run (0: not an ssh cluster, or turned off)."""
    cluster = plan.cluster
    if not cluster.remote or not cluster.network.preflight:
        return 0
    timeout_s = cluster.network.probe_timeout_s
    problems = unreachable(plan, executor, timeout_s, client_probe)
    hint = DISABLE_HINT
    if any(line.startswith("this machine (pytest)") for line in problems):
        hint += (
            "; behind a bastion, reach the nodes through SSH with `network: {client: ssh_forward}`"
        )
    _raise("network pre-flight", problems, hint)
    return len(probes(plan))


def _raise(what: str, problems: Sequence[str], hint: str) -> None:
    if not problems:
        return
    count = len(problems)
    tail = f"\nFix the addresses or the network, {hint}." if hint else ""
    raise NetworkError(
        f"{what} found {count} problem{'s' if count > 1 else ''}; nothing was started:\n"
        + "\n".join(f"  {p}" for p in problems)
        + tail
    )


def _parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items``, one thread each (at most 16): SSH round trips add up in sequence."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        return list(pool.map(fn, items))
