"""The validated cluster as frozen records: what every caller reads.

Built by :func:`pytest_kimi.config.load_cluster` from the checked pydantic models; plain
frozen dataclasses so a :class:`Layout` can be a pytest parameter and tests can build a
:class:`Node` by hand. Parsed forms of text fields (``goodput_ms``, ``regression_thresholds``)
sit next to the raw text, which goes into manifests as written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.config.yamlfile import Located

if TYPE_CHECKING:
    from pytest_kimi.config.versions import RouterPackage


@dataclass(frozen=True)
class SSHConfig:
    """How to reach a node over SSH. Secrets are never values here, only where to find them."""

    user: str = "root"
    port: int = 22
    key: str | None = None  # private key file
    passphrase_env: str | None = None  # NAME of the environment variable holding its passphrase
    known_hosts: str | None = None  # default: ~/.ssh/known_hosts
    check_host_keys: bool = True
    jump_host: str | None = None  # [user@]host[:port]
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 120.0
    reconnect_s: float = 60.0  # bring-up and run: patience with a node that stopped answering
    teardown_reconnect_s: float = 300.0  # teardown: the longest patience


@dataclass(frozen=True)
class Node:
    """One machine of the cluster (a local process group on the mock)."""

    name: str
    host: str
    gpus: int
    ssh: SSHConfig = field(default_factory=SSHConfig)
    env: Mapping[str, str] = field(default_factory=dict)  # this node's extra server environment
    addr: str | None = None  # data-network address; None: resolved on the node at bring-up


@dataclass(frozen=True)
class PDSide:
    """One side of a prefill/decode disaggregated layout (``--disaggregation-mode``)."""

    role: str  # "prefill" or "decode"
    tp: int
    pp: int
    ep: int
    replicas: int
    nodes_per_replica: int
    args: tuple[tuple[str, Any], ...] = ()  # over server.args and the layout's args
    env: tuple[tuple[str, str], ...] = ()  # over the layout's environment
    policy: str | None = None  # the router's --prefill-policy / --decode-policy
    bootstrap_port: int | None = 8998  # prefill: --disaggregation-bootstrap-port; None = auto

    @property
    def label(self) -> str:
        return f"TP{self.tp}/PP{self.pp}/EP{self.ep}"


@dataclass(frozen=True)
class Layout:
    """One configuration to measure: a parallel layout of one replica (tensor, pipeline and
    expert parallel sizes) and what else it changes from the cluster's defaults. The cluster
    resolves the defaults (:meth:`ClusterConfig.replicas_of`, :meth:`ClusterConfig.server_args`).
    A disaggregated layout has ``sides`` (prefill, then decode) instead of one replica's sizes
    (``tp``, ``pp``, ``ep`` are then 0)."""

    name: str
    tp: int
    pp: int
    ep: int
    slo: tuple[tuple[str, str], ...] = ()  # SLOs for this layout only (override the cluster's)
    args: tuple[tuple[str, Any], ...] = ()  # server flags over server.args; None removes one
    env: tuple[tuple[str, str], ...] = ()  # server environment over server.env
    nodes: tuple[str, ...] = ()  # the nodes it runs on, in order; () = the cluster's
    replicas: int | None = None  # None: deployment.replicas
    nodes_per_replica: int | None = None  # None: deployment.nodes_per_replica
    router_node: str | None = None  # None: router.node
    router_policy: str | None = None  # None: router.policy
    router_args: tuple[tuple[str, Any], ...] = ()  # over router.args; None removes one
    sides: tuple[PDSide, ...] = ()  # prefill and decode of a disaggregated layout
    transfer_backend: str = "mooncake"  # disaggregated: --disaggregation-transfer-backend

    @property
    def disaggregated(self) -> bool:
        return bool(self.sides)

    @property
    def label(self) -> str:
        if self.disaggregated:
            return " + ".join(f"{side.role} {side.label} x{side.replicas}" for side in self.sides)
        return f"TP{self.tp}/PP{self.pp}/EP{self.ep}"


@dataclass(frozen=True)
class Replica:
    """One replica of a layout as it is deployed: its index among all the layout's replicas,
    its role (``""``; ``prefill`` or ``decode`` when disaggregated), sizes and nodes."""

    index: int
    role: str
    tp: int
    pp: int
    ep: int
    nodes: tuple[Node, ...]
    side: PDSide | None = None


@dataclass(frozen=True)
class ContainerConfig:
    """Where a process runs inside a container (docs/containers.md)."""

    runtime: str  # docker | podman | apptainer | singularity
    mode: str  # exec: into a running container; run: start one from ``image``
    name: str | None  # exec: the running container; run: None = kimi-<run>-<proc>
    image: str | None = None  # run mode
    mounts: tuple[str, ...] = ()  # run mode: SRC:DST[:ro]
    gpus: str | tuple[int, ...] = "all"  # run mode: all | none | GPU indexes
    args: tuple[str, ...] = ()  # run mode: extra runtime flags
    executable: str | None = None  # the runtime's CLI on the nodes; None = the runtime's name

    @property
    def cli(self) -> str:
        return self.executable or self.runtime


@dataclass(frozen=True)
class ServerConfig:
    """How to start one SGLang server process on a node."""

    python: str
    module: str
    model_path: str
    wrapper: tuple[str, ...]  # argv put before python, e.g. a container: [docker, exec, sglang]
    port: int | None  # None: pick a free port at bring-up (local only)
    dist_init_port: int | None
    args: Mapping[str, str | int | float | bool]
    env: Mapping[str, str]
    env_from_local: tuple[str, ...] = ()  # names copied from the pytest machine's environment
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)  # their values
    setup: tuple[str, ...] = ()  # shell lines run before the command, in the same shell
    container: ContainerConfig | None = None
    sglang_version: str | None = None  # None: the newest profile (pytest_kimi.config.versions)
    sglang_version_from: str = "server.sglang_version"  # or --kimi-sglang-version


@dataclass(frozen=True)
class RouterConfig:
    """How to start the SGLang Router in front of the replicas."""

    python: str
    module: str | None  # None: the package's launcher (pytest_kimi.config.versions.RouterPackage)
    node: str
    port: int | None
    prometheus_port: int | None
    policy: str
    args: Mapping[str, str | int | float | bool]
    env: Mapping[str, str]
    wrapper: tuple[str, ...] = ()
    model_mount: str | None = None  # the model dir the router reads its tokenizer from
    env_from_local: tuple[str, ...] = ()  # names copied from the pytest machine's environment
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)  # their values
    setup: tuple[str, ...] = ()  # shell lines run before the command, in the same shell
    container: ContainerConfig | None = None
    allow_unknown_version: bool = False  # start a router outside its supported range (a note)
    package: str = "auto"  # smg, sglang-router, or auto: the router node's, smg first


@dataclass(frozen=True)
class WorkloadConfig:
    """The benchmark workload: SPEED-Bench rows, lengths, concurrency."""

    dataset: str
    num_requests: int
    input_len: int
    output_len: int
    concurrency: int
    warmup_requests: int
    api: str
    seed: int
    category: str | None
    request_timeout_s: float
    request_rate: float  # requests/s; inf sends as fast as concurrency allows
    percentiles: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
    goodput: Mapping[str, str] = field(default_factory=dict)  # per-request limits: ttft/tpot/e2e
    goodput_ms: Mapping[str, float] = field(default_factory=dict)  # the same limits, parsed
    speedbench_config: str = "throughput_16k"  # config of a snapshot directory
    prompt: str = "raw"  # raw | chat_template | chat_template_or_raw
    clock_start: str = "request"  # request (bench_serving's) | send: where TTFT and E2E start
    # settings the file sweeps (setting -> its values; the first is the field's): points
    sweeps: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class MockConfig:
    """Embedded mock backend settings: time scale, seed, performance profile (the SGLang
    version it answers as is ``server.sglang_version``)."""

    time_scale: float
    seed: int
    profile: Mapping[str, Any]


@dataclass(frozen=True)
class SlurmConfig:
    """``executor: slurm``: the allocation's flags and where the router runs."""

    partition: str | None = None
    account: str | None = None
    time: str = "04:00:00"
    gres: str | None = None
    gpus_per_node: int | None = None
    constraint: str | None = None
    reservation: str | None = None
    exclusive: bool = True
    job_name: str = "pytest-kimi"
    salloc_args: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    router: str = "node"  # or "submit_host"
    queue_timeout_s: float = 900.0  # load: slurm.queue_timeout_s, else startup_timeout_s


SUBMIT_HOST = "submit-host"
"""The router's node name when ``slurm.router: submit_host`` (it runs here, not in the job)."""


@dataclass(frozen=True)
class TelemetryConfig:
    """GPU telemetry during the measured run (``pytest_kimi.deploy.telemetry``)."""

    enabled: bool = True
    interval_s: float = 5.0  # wall seconds on the machine running pytest


@dataclass(frozen=True)
class WatchdogConfig:
    """Node processes and the router's workers polled while measured
    (``pytest_kimi.deploy.watchdog``)."""

    enabled: bool = True
    interval_s: float = 15.0  # wall seconds between polls
    misses: int = 2  # polls in a row without an answer (or with a worker short) before a loss


@dataclass(frozen=True)
class LockConfig:
    """A lock on every node for a deployment's lifetime (``pytest_kimi.deploy.locks``)."""

    enabled: bool = True
    dir: str = ""  # on each node, holds <hostname>.lock; "" = <work_dir>/locks


@dataclass(frozen=True)
class PreflightConfig:
    """GPU pre-flight before launch: GPU count per node, and every GPU idle."""

    enabled: bool = True
    busy_memory_mib: float = 2048.0  # more memory used than this: the GPU is busy


@dataclass(frozen=True)
class NetworkConfig:
    """The data network (``pytest_kimi.deploy.network``)."""

    interface: str | None = None  # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME of every server
    preflight: bool = True  # addresses and TCP reachability checked before launch
    probe_timeout_s: float = 3.0
    client: str = "direct"  # "direct", "ssh_forward" or "on_node" (pytest_kimi.deploy.reach)
    client_node: str = ""  # on_node: the node the benchmark client runs on (the router's)
    client_python: tuple[str, ...] = ()  # on_node: its Python (server.python)

    def socket_env(self) -> dict[str, str]:
        """The variables that pin Gloo's and NCCL's sockets to the data network."""
        if self.interface is None:
            return {}
        return {"GLOO_SOCKET_IFNAME": self.interface, "NCCL_SOCKET_IFNAME": self.interface}


@dataclass(frozen=True)
class LogsConfig:
    """Process logs (:mod:`pytest_kimi.deploy.logs`): the fetch cap, run folders kept."""

    max_mib: float = 64.0  # per log fetched; longer: head and tail kept, a marker between
    keep_runs: int = 10  # run folders kept in work_dir on each node (older pruned at start)
    tail_report_s: float = 60.0  # measured run: each process's changed last log line (0: off)

    @property
    def max_bytes(self) -> int:
        return int(self.max_mib * 1024 * 1024)


@dataclass(frozen=True)
class ClusterConfig:
    """A whole cluster file, validated."""

    path: Path
    name: str
    executor: str
    nodes: tuple[Node, ...]
    replicas: int
    nodes_per_replica: int
    layouts: Mapping[str, Layout]
    server: ServerConfig
    router: RouterConfig
    workload: WorkloadConfig
    slo: Mapping[str, str]
    mock: MockConfig | None
    startup_timeout_s: float
    source: Located = field(repr=False, compare=False)
    work_dir: str = "/var/tmp/pytest-kimi"  # on each node: logs, exit codes (survives reboots)
    regression: Mapping[str, str] = field(default_factory=dict)  # gate thresholds, e.g. 10%
    regression_thresholds: Mapping[str, float] = field(default_factory=dict)  # parsed: 0.1
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    locks: LockConfig = field(default_factory=LockConfig)
    nvidia_smi: tuple[str, ...] = ()  # argv of nvidia-smi on the nodes; () = "nvidia-smi"
    network: NetworkConfig = field(default_factory=NetworkConfig)
    startup_stall_s: float = 600.0  # a starting process's log silent this long: stalled
    startup_report_s: float = 60.0  # between bring-up reports (state, last log line)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    deployment_max_s: float = 43200.0  # SSH: the longest a node process may live (`timeout`)
    history: Path | None = None  # history: resolved against the cluster file's folder
    # the ${NAME} references the file was read with: name -> value (or default) used
    variables: Mapping[str, str] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """The cluster file's SHA-256 as it was read (not as it may have been edited since)."""
        return self.source.sha256

    @property
    def time_scale(self) -> float:
        """Cluster seconds per wall second: 1 on a real cluster."""
        return self.mock.time_scale if self.mock else 1.0

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def layout(self, name: str) -> Layout:
        """The layout called ``name``; a clear error lists the known ones."""
        try:
            return self.layouts[name]
        except KeyError:
            known = ", ".join(self.layouts)
            raise self.source.error(
                "layouts", f"unknown layout {name!r}; this cluster defines: {known}"
            ) from None

    def replicas_of(self, layout: Layout | None) -> int:
        """How many replicas the layout deploys (both sides of a disaggregated one)."""
        if layout is not None and layout.disaggregated:
            return sum(side.replicas for side in layout.sides)
        return layout.replicas if layout is not None and layout.replicas else self.replicas

    def nodes_per_replica_of(self, layout: Layout) -> int:
        return layout.nodes_per_replica or self.nodes_per_replica

    def layout_nodes(self, layout: Layout | None) -> tuple[Node, ...]:
        """The nodes ``layout`` may use, in order (all of the cluster's unless it names some)."""
        if layout is None or not layout.nodes:
            return self.nodes
        return tuple(self.node(name) for name in layout.nodes)

    def replica_nodes(self, replica: int, layout: Layout | None = None) -> tuple[Node, ...]:
        """The nodes of one replica: the first replicas x nodes_per_replica of the layout's
        nodes, in order (without a layout: the cluster's default deployment; a disaggregated
        layout: :meth:`layout_replicas`)."""
        if layout is not None and layout.disaggregated:
            return self.layout_replicas(layout)[replica].nodes
        per = self.nodes_per_replica if layout is None else self.nodes_per_replica_of(layout)
        start = replica * per
        return self.layout_nodes(layout)[start : start + per]

    def layout_replicas(self, layout: Layout) -> tuple[Replica, ...]:
        """Every replica the layout deploys, in order: each takes the next nodes of the
        layout's; a disaggregated layout's prefill replicas first, then its decode ones."""
        if not layout.disaggregated:
            return tuple(
                Replica(i, "", layout.tp, layout.pp, layout.ep, self.replica_nodes(i, layout))
                for i in range(self.replicas_of(layout))
            )
        nodes, out, start = self.layout_nodes(layout), [], 0
        for side in layout.sides:
            for _ in range(side.replicas):
                end = start + side.nodes_per_replica
                out.append(Replica(len(out), side.role, side.tp, side.pp, side.ep,
                                   nodes[start:end], side))  # fmt: skip
                start = end
        return tuple(out)

    def used_nodes(self, layout: Layout | None = None) -> tuple[Node, ...]:
        """Every node a layout's servers run on (without a layout: the default deployment's)."""
        if layout is not None:
            return tuple(node for replica in self.layout_replicas(layout) for node in replica.nodes)
        return tuple(node for r in range(self.replicas) for node in self.replica_nodes(r))

    def deployment_nodes(self, layout: Layout | None = None) -> tuple[Node, ...]:
        """Every node a deployment touches: its servers' nodes, then the router's if it is not
        one of them."""
        used = {node.name: node for node in self.used_nodes(layout)}
        router = self.router_node(layout)
        used.setdefault(router.name, router)
        return tuple(used.values())

    def server_args(self, layout: Layout, side: PDSide | None = None) -> dict[str, Any]:
        """server.args with the layout's own changes (a None value removes a flag), then those
        of one side of a disaggregated layout."""
        return merged(merged(self.server.args, layout.args), side.args if side else ())

    def server_env(self, layout: Layout, side: PDSide | None = None) -> dict[str, str]:
        return {**self.server.env, **dict(layout.env), **dict(side.env if side else ())}

    @property
    def remote(self) -> bool:
        """The nodes are other machines (ssh, slurm): fixed ports, data-network addresses,
        GPU state and logs on the nodes; not this machine's processes (local)."""
        return self.executor in ("ssh", "slurm")

    def router_node(self, layout: Layout | None = None) -> Node:
        if self.executor == "slurm" and self.slurm.router == "submit_host":
            return Node(SUBMIT_HOST, "127.0.0.1", 0, addr="127.0.0.1")
        own = layout.router_node if layout is not None else None
        return self.node(own or self.router.node)

    def router_policy(self, layout: Layout, side: PDSide | None = None) -> str:
        """The router's policy for the layout (for one side of a disaggregated one)."""
        own = side.policy if side is not None else None
        return own or layout.router_policy or self.router.policy

    def router_args(
        self, layout: Layout, package: RouterPackage, version: str | None = None
    ) -> dict[str, Any]:
        """The package's benchmark settings (of ``version``; None: its newest we read), then
        router.args, then the layout's changes."""
        from pytest_kimi.config.versions import router_args

        return merged(router_args(package, self.router.args, version), layout.router_args)


def merged(base: Mapping[str, Any], changes: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``base`` with ``changes`` applied in order: a value sets a flag, None removes it."""
    out = dict(base)
    for name, value in changes:
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out
