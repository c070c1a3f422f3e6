"""Where a deployment runs, as frozen records: nodes, layouts, replicas, a Slurm allocation.

Built by :func:`pytest_kimi.config.load_cluster` (from :mod:`~pytest_kimi.config.nodemodels`
and :mod:`~pytest_kimi.config.layoutmodels`) and read through
:class:`~pytest_kimi.config.cluster.ClusterConfig`, which resolves a layout's defaults. Plain
frozen dataclasses so a :class:`Layout` can be a pytest parameter and tests can build a
:class:`Node` by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
    default: bool = True  # runs when --layout names none (False: only when named)

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
