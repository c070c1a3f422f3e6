"""From cluster + layout to the exact processes to start: one server per node, one router.

A plan is plain data (argv lists, environment, URLs); executors turn it into processes and
``--kimi-dry-run`` prints it. Values from YAML only ever become separate argv elements, and
``shlex.join`` renders them, so nothing a user writes is ever interpreted by a shell.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from pytest_kimi.config import ClusterConfig, ContainerConfig, Layout, Node, Replica
from pytest_kimi.config.checks import MOCK_MODULE  # the mock's module, checked there too
from pytest_kimi.config.serverargs import flags, resolve_model_path
from pytest_kimi.config.versions import SGLangProfile, Versions, assumed
from pytest_kimi.deploy.ports import PortBook, free_port
from pytest_kimi.deploy.secrets import REDACTED, redact_env


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start on one node."""

    name: str  # unique in the plan, also the log file's stem
    node: Node
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    role: str = "server"  # "server" or "router"
    replica: int | None = None
    rank: int | None = None
    port: int = 0
    # the values of env_from_local: kept apart from ``env`` so that nothing reading ``env``
    # (manifests, version probes, dry runs) can see them; only executors, at start, do
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    setup: tuple[str, ...] = ()  # shell lines run before argv, in the same shell
    container: ContainerConfig | None = None
    addr: str = ""  # the data-network address it binds and is reached at; "" = node.host
    disaggregation: str = ""  # a disaggregated layout's side: "prefill" or "decode"
    bootstrap_port: int | None = None  # a prefill head: its KV bootstrap server's port
    replica_name: str = ""  # replica0; prefill0, decode0 (numbered within their side)

    @property
    def bind_addr(self) -> str:
        return self.addr or self.node.host

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.bind_addr)}:{self.port}"

    @property
    def launch_env(self) -> dict[str, str]:
        """Every variable the process gets: ``env`` and the secret ones. For executors only."""
        return {**self.env, **self.secret_env}

    def command_line(self, redact: bool = True) -> str:
        """The shell-safe command line (environment first), as an engineer would type it.

        With ``redact`` (the default: this text goes to terminals and manifests) values of
        secret-looking variables, and every ``env_from_local`` one, are ``***``."""
        env_items = redact_env(self.env) if redact else dict(self.env)
        for name, value in self.secret_env.items():
            env_items[name] = REDACTED if redact else value
        env = [f"{k}={shlex.quote(v)}" for k, v in env_items.items()]
        return " ".join([*env, shlex.join(self.argv)])

    def describe(self) -> list[str]:
        """The command line, preceded by the setup lines and the container, as comments."""
        lines = [f"#   setup: {line}" for line in self.setup]
        box = self.container
        if box is not None:
            where = box.name if box.mode == "exec" else box.image
            lines.append(f"#   in a {box.runtime} container ({box.mode} {where})")
        return [*lines, self.command_line()]


@dataclass(frozen=True)
class DeploymentPlan:
    """Every process of one layout's DP deployment, in start order."""

    cluster: ClusterConfig
    layout: Layout
    servers: tuple[ProcessSpec, ...]
    router: ProcessSpec
    mock_clock: str | None = None  # the shared cluster clock file of a local mock run
    # executor: slurm, once granted: {"job": id, "nodes": [...], "queue_wait_s": s}
    allocation: Mapping[str, object] | None = None
    versions: Versions | None = None  # what the command lines are built for

    @property
    def processes(self) -> tuple[ProcessSpec, ...]:
        return (*self.servers, self.router)

    def rank0(self) -> list[ProcessSpec]:
        """The HTTP-serving process of each replica (what the router registers; in a
        disaggregated layout the prefill heads, then the decode heads)."""
        return [s for s in self.servers if s.rank == 0]

    @property
    def endpoint(self) -> str:
        return self.router.url

    @property
    def router_metrics_url(self) -> str | None:
        """The router's Prometheus endpoint (its retry counters), if it exports one."""
        argv = self.router.argv
        if "--prometheus-port" not in argv:
            return None
        port = argv[argv.index("--prometheus-port") + 1]
        host = argv[argv.index("--prometheus-host") + 1] if "--prometheus-host" in argv else ""
        return f"http://{_url_host(host or self.router.bind_addr)}:{port}/metrics"

def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _mock_gpu_flags(cluster: ClusterConfig, node: Node, scope: str | None) -> list[str]:
    """Where a mock server publishes its GPUs for the stand-in nvidia-smi (deploy/gpus.py)."""
    from pytest_kimi.deploy.gpus import mock_gpu_dir

    state = mock_gpu_dir(cluster, node, scope)
    return ["--mock-node", node.name, "--mock-gpu-state", state] if state else []


def mock_clock_path(cluster: ClusterConfig, scope: str | None) -> str | None:
    """The shared cluster clock of a local mock run (pytest_kimi/workload/sharedclock.py), one per
    ``<run>/<layout>`` scope; None where the processes do not share this machine (SSH), on
    real SGLang, and without a scope (a dry run). The harness creates it before bring-up."""
    if cluster.executor != "local" or cluster.mock is None or scope is None:
        return None
    if cluster.server.module != MOCK_MODULE:
        return None
    return f"{cluster.work_dir.rstrip('/')}/mock-clock/{scope}/clock"


def _disaggregation_flags(
    layout: Layout, role: str, bootstrap: int | None, sglang: SGLangProfile
) -> list[str]:
    """SGLang's flags for one side of a disaggregated layout (none for a unified replica):
    its mode and transfer backend, the prefill's bootstrap port; where the release has them
    (:attr:`~pytest_kimi.config.versions.SGLangProfile.pd_shape_flags`) the decode side's TP for the
    prefill (its KV is sliced for it) and the prefill's PP for the decode (it pulls every
    stage's KV); later releases learn both through the bootstrap server."""
    if not role:
        return []
    prefill, decode = layout.sides
    flags = ["--disaggregation-mode", role,
             "--disaggregation-transfer-backend", layout.transfer_backend]  # fmt: skip
    if role == "prefill":
        flags += ["--disaggregation-bootstrap-port", str(bootstrap)]
        if sglang.pd_shape_flags:
            flags += ["--disaggregation-decode-tp", str(decode.tp)]
    elif sglang.pd_shape_flags:
        flags += ["--disaggregation-prefill-pp", str(prefill.pp)]
    return flags


def _router_workers(cluster: ClusterConfig, layout: Layout, heads: list[ProcessSpec]) -> list[str]:
    """The router's workers and policy: ``--worker-urls`` of every replica head, or in PD mode
    (sglang-router's ``--pd-disaggregation``) one ``--prefill URL BOOTSTRAP_PORT`` per prefill
    head, one ``--decode URL`` per decode head, and a policy per side."""
    if not layout.disaggregated:
        return ["--worker-urls", *(s.url for s in heads),
                "--policy", cluster.router_policy(layout)]  # fmt: skip
    argv = ["--pd-disaggregation"]
    for spec in heads:
        if spec.disaggregation == "prefill":
            argv += ["--prefill", spec.url, str(spec.bootstrap_port)]
    for spec in heads:
        if spec.disaggregation == "decode":
            argv += ["--decode", spec.url]
    prefill, decode = layout.sides  # each side's policy (--policy alone would be ignored)
    return [
        *argv,
        "--prefill-policy", cluster.router_policy(layout, prefill),
        "--decode-policy", cluster.router_policy(layout, decode),
    ]  # fmt: skip


def _host_ip_env(nodes: tuple[Node, ...], address: str) -> dict[str, str]:
    """``SGLANG_HOST_IP`` for a rank of a replica spanning nodes: SGLang's cross-node broadcast
    (``shm_broadcast``'s ZMQ socket, ``get_local_ip_auto``) binds and announces this address.
    Without it SGLang guesses from a route to 8.8.8.8, then the hostname: on a node without a
    default route (an isolated cluster network) that is a loopback or wrong address, and the
    replica's ranks wait for each other for ever after "Init parallel". One node: not needed.
    Only an IP address: ZMQ binds no host name, so a name (an ``addr:`` written as one) leaves
    SGLang to its own guess."""
    if len(nodes) < 2:
        return {}
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return {}
    return {"SGLANG_HOST_IP": address}


def cluster_versions(cluster: ClusterConfig) -> Versions:
    """What a plan is built for before the nodes are asked: ``server.sglang_version`` (or
    the newest profile) and ``router.package`` (smg for auto)."""
    server, router = cluster.server, cluster.router
    return assumed(server.sglang_version, router.package, server.sglang_version_from,
                   router.module)  # fmt: skip


def plan_deployment(
    cluster: ClusterConfig,
    layout: Layout,
    *,
    ports: Iterable[int] | None = None,
    book: PortBook | None = None,
    gpu_scope: str | None = None,
    addrs: Mapping[str, str] | None = None,
    versions: Versions | None = None,
) -> DeploymentPlan:
    """Build the plan. ``ports`` supplies values for ``auto`` ports (tests pass their own);
    else ``book`` books them on this machine until the deployment is gone
    (:mod:`pytest_kimi.deploy.ports`; a dry run, which starts nothing, takes any free one);
    ``gpu_scope`` (``<run>/<layout>``) tells mock servers where to publish their GPUs;
    ``addrs`` (node name -> address, :func:`pytest_kimi.deploy.network.node_addresses`) are
    the data-network addresses resolved on the nodes, for nodes without ``addr``;
    ``versions`` the SGLang profile and router package the command lines are for (default:
    :func:`cluster_versions`; bring-up passes what the nodes run).

    Every server binds its node's address (``--host``), peers reach the replica head at its
    address (``--dist-init-addr``), and the router and the client use those addresses. Without
    ``addr`` or a resolved one (a dry run of an ssh cluster; a local cluster) it is ``host``."""
    planner = _Planner(cluster, layout, ports, book, gpu_scope, addrs, versions)
    servers = planner.servers()
    router = planner.router(servers)
    return DeploymentPlan(cluster, layout, tuple(servers), router, mock_clock=planner.clock,
                          versions=planner.versions)  # fmt: skip


class _Planner:
    """The steps of :func:`plan_deployment`, over its arguments. ``auto`` ports are drawn in
    the order the processes are listed (replica by replica, then the router): tests that
    pass ``ports`` rely on it."""

    def __init__(
        self,
        cluster: ClusterConfig,
        layout: Layout,
        ports: Iterable[int] | None,
        book: PortBook | None,
        gpu_scope: str | None,
        addrs: Mapping[str, str] | None,
        versions: Versions | None,
    ) -> None:
        self.cluster, self.layout, self.book, self.gpu_scope = cluster, layout, book, gpu_scope
        self.supply: Iterator[int] | None = iter(ports) if ports is not None else None
        self.resolved: Mapping[str, str] = addrs or {}
        self.versions = versions or cluster_versions(cluster)
        self.socket_env = cluster.network.socket_env()
        self.clock = mock_clock_path(cluster, gpu_scope)
        self.model_path = resolve_model_path(cluster.server.model_path)

    def addr(self, node: Node) -> str:
        return self.resolved.get(node.name) or node.addr or ""

    def port(self, value: int | None, host: str) -> int:
        if value is not None:
            return value
        if self.supply is not None:
            return next(self.supply)
        return self.book.take(host) if self.book is not None else free_port(host)

    def servers(self) -> list[ProcessSpec]:
        """Every server of the layout, replica by replica, each replica's ranks in order."""
        servers: list[ProcessSpec] = []
        per_role: dict[str, int] = {}  # prefill0, prefill1, decode0: numbered within their side
        for replica in self.cluster.layout_replicas(self.layout):
            number = per_role[replica.role] = per_role.get(replica.role, -1) + 1
            servers += self.replica_servers(replica, f"{replica.role or 'replica'}{number}")
        return servers

    def replica_servers(self, replica: Replica, name: str) -> list[ProcessSpec]:
        """One server per node of the replica; rank 0 (the head) serves HTTP and runs the
        distributed init (and, for a prefill replica, the KV bootstrap server)."""
        cluster, layout, versions = self.cluster, self.layout, self.versions
        srv = cluster.server
        nodes = replica.nodes
        head = nodes[0]
        dist_port = self.port(srv.dist_init_port, head.host)
        head_addr = self.addr(head) or head.host
        bootstrap = None
        if replica.role == "prefill":
            assert replica.side is not None
            bootstrap = self.port(replica.side.bootstrap_port, head.host)
        servers: list[ProcessSpec] = []
        for rank, node in enumerate(nodes):
            http_port = self.port(srv.port, node.host)
            argv = [
                *srv.wrapper, srv.python, "-m", srv.module,
                "--model-path", self.model_path,
                "--tp-size", str(replica.tp),
                "--pp-size", str(replica.pp),
                "--ep-size", str(replica.ep),
                "--nnodes", str(len(nodes)),
                "--node-rank", str(rank),
                "--dist-init-addr", f"{_url_host(head_addr)}:{dist_port}",
                "--host", self.addr(node) or node.host,
                "--port", str(http_port),
                *_disaggregation_flags(layout, replica.role, bootstrap, versions.sglang),
                *flags(cluster.server_args(layout, replica.side)),
                *self.mock_flags(replica, rank, node),
            ]  # fmt: skip
            servers.append(
                ProcessSpec(
                    name=f"{name}-node{rank}-{node.name}",
                    replica_name=name,
                    node=node,
                    argv=tuple(argv),
                    env={
                        **self.socket_env,
                        **_host_ip_env(nodes, self.addr(node) or node.host),
                        **cluster.server_env(layout, replica.side),
                        **node.env,
                    },
                    replica=replica.index,
                    rank=rank,
                    port=http_port,
                    secret_env=dict(srv.secret_env),
                    setup=srv.setup,
                    container=srv.container,
                    addr=self.addr(node),
                    disaggregation=replica.role,
                    bootstrap_port=bootstrap if rank == 0 else None,
                )
            )
        return servers

    def mock_flags(self, replica: Replica, rank: int, node: Node) -> list[str]:
        """The embedded mock's own flags for one server (none on real SGLang)."""
        mock = self.cluster.mock
        if self.cluster.server.module != MOCK_MODULE or mock is None:
            return []
        argv = [
            "--mock-time-scale", f"{mock.time_scale:g}",
            "--mock-seed", str(mock.seed + replica.index),
            "--mock-gpus-per-node", str(node.gpus),
        ]  # fmt: skip
        argv += _mock_gpu_flags(self.cluster, node, self.gpu_scope)
        argv += ["--mock-sglang-version", self.versions.sglang.mock_wire]
        if self.clock is not None and rank == 0:  # rank 0 runs the replica's model
            argv += ["--mock-clock", self.clock]
        if mock.profile:  # inline: the node needs no file of ours
            profile = json.dumps(dict(mock.profile), separators=(",", ":"))
            argv += ["--mock-profile", profile]
        return argv

    def router(self, servers: list[ProcessSpec]) -> ProcessSpec:
        """The router on its node, in front of every replica head."""
        cluster, layout, versions = self.cluster, self.layout, self.versions
        rtr = cluster.router
        router_node = cluster.router_node(layout)
        router_port = self.port(rtr.port, router_node.host)
        prometheus_port = self.port(rtr.prometheus_port, router_node.host)
        router_addr = self.addr(router_node) or router_node.host
        router_argv = [
            *rtr.wrapper, rtr.python, "-m", rtr.module or versions.router.module,
            *_router_workers(cluster, layout, [s for s in servers if s.rank == 0]),
            "--host", router_addr,
            "--port", str(router_port),
            "--prometheus-host", router_addr,
            "--prometheus-port", str(prometheus_port),
            *flags(cluster.router_args(layout, versions.router, versions.router_version)),
        ]  # fmt: skip
        return ProcessSpec(
            name="router",
            node=router_node,
            argv=tuple(router_argv),
            env=dict(rtr.env),
            role="router",
            port=router_port,
            secret_env=dict(rtr.secret_env),
            setup=rtr.setup,
            container=rtr.container,
            addr=self.addr(router_node),
        )
