"""The validated cluster as frozen records: what every caller reads.

Built by :func:`pytest_kimi.config.load_cluster` from the checked pydantic models; plain
frozen dataclasses so a :class:`Layout` can be a pytest parameter and tests can build a
:class:`Node` by hand. Parsed forms of text fields (``goodput_ms``, ``regression_thresholds``)
sit next to the raw text, which goes into manifests as written.

:class:`ClusterConfig` (the whole file, and the defaults it resolves per layout) is here; the
records of its sections are in :mod:`~pytest_kimi.config.topology` (nodes, layouts, replicas,
Slurm), :mod:`~pytest_kimi.config.processes` (server, router, mock) and
:mod:`~pytest_kimi.config.runsettings` (workload, telemetry, pre-flight, network, watchdog,
locks, logs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.config.processes import MockConfig, RouterConfig, ServerConfig
from pytest_kimi.config.runsettings import (
    LockConfig,
    LogsConfig,
    NetworkConfig,
    PreflightConfig,
    TelemetryConfig,
    WatchdogConfig,
    WorkloadConfig,
)
from pytest_kimi.config.topology import Layout, Node, PDSide, Replica, SlurmConfig
from pytest_kimi.config.yamlfile import Located

if TYPE_CHECKING:
    from pytest_kimi.config.versions import RouterPackage


SUBMIT_HOST = "submit-host"
"""The router's node name when ``slurm.router: submit_host`` (it runs here, not in the job)."""


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
    workloads: Mapping[str, WorkloadConfig] = field(default_factory=dict)  # by name: workloads:
    slo_confidence: float | None = None  # slo.confidence: verdicts compare bounds at it

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

    def named_workload(self, name: str) -> WorkloadConfig:
        """The workload the file names ``name`` (``workloads:``); a clear error lists them."""
        try:
            return self.workloads[name]
        except KeyError:
            known = ", ".join(self.workloads) or "none"
            raise self.source.error(
                "workloads", f"unknown workload {name!r}; this cluster file names: {known}"
            ) from None

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
