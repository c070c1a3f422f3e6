"""The cluster file's run safeguards as pydantic models: checks, reach, watching, logs.

``telemetry``, ``preflight``, ``network``, ``watchdog``, ``locks`` and ``logs``: the sections
about how a deployment is checked, reached and watched rather than what it is. Part of the
file's shape (:mod:`pytest_kimi.config.models`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pytest_kimi.config.fields import Argv, NodeName, NonNegative, Seconds, Text
from pytest_kimi.config.strictmodel import StrictModel


class Telemetry(StrictModel):
    """GPU telemetry during the measured run: nvidia-smi on every node, every interval_s."""

    enabled: bool = Field(True, description="Sample the nodes' GPUs into telemetry.jsonl.")
    interval_s: Seconds = Field(
        5.0, description="Wall seconds (on the machine running pytest) between samples."
    )


class Preflight(StrictModel):
    """GPU pre-flight: before anything starts, every node's GPUs are counted and must be idle."""

    enabled: bool = Field(True, description="Check every node's GPUs before launch.")
    busy_memory_mib: Annotated[float, Field(ge=0)] = Field(
        2048.0, description="A GPU with more memory used than this (MiB) is busy."
    )


class Network(StrictModel):
    """The data network: socket interface of Gloo/NCCL, and the pre-flight reachability check."""

    interface: Text | None = Field(
        None,
        description="Interface of the data network (e.g. eth0, ib0): sets GLOO_SOCKET_IFNAME "
        "and NCCL_SOCKET_IFNAME of every server (server.env / a node's env win), and is where "
        "an absent addr is read from.",
    )
    preflight: bool = Field(
        True, description="Check addresses and TCP reachability between the nodes before launch."
    )
    probe_timeout_s: Seconds = Field(3.0, description="Seconds one TCP probe may wait.")
    client: Literal["direct", "ssh_forward", "on_node"] = Field(
        "direct",
        description="How this machine reaches the nodes' HTTP ports (health, warm-up, metrics, "
        "the benchmark): direct, or ssh_forward (local port forwards over each node's SSH "
        "connection, through ssh.jump_host if set: for a bastion as the only way in), or "
        "on_node (the benchmark client runs on network.client_node and times the requests "
        "there, over the cluster network; everything else goes as with ssh_forward).",
    )
    client_node: NodeName | None = Field(
        None,
        description="With client: on_node, the node the benchmark client runs on; default: "
        "the router's node.",
    )
    client_python: Argv = Field(
        default_factory=list,
        description="With client: on_node, the Python that runs the client on that node (it "
        "needs 3.11+ with httpx and orjson, as SGLang's environment has); default: server.python. "
        "Required when the servers run in a container: the client runs on the node itself.",
    )


class Watchdog(StrictModel):
    """While a layout is measured: every node process's exit status and the router's worker
    count, polled; a lost worker stops the run at once, naming the node."""

    enabled: bool = Field(True, description="Watch the deployment while it is measured.")
    interval_s: Seconds = Field(
        15.0, description="Wall seconds (on the machine running pytest) between polls."
    )
    misses: Annotated[int, Field(ge=1)] = Field(
        2,
        description="Polls in a row a node or the router may go unanswered, or the router "
        "count a worker short, before the run is stopped (an exited process stops it at once).",
    )


class Locks(StrictModel):
    """A lock on every node (SSH clusters) held for a deployment's lifetime, so a second run
    on the same nodes is refused at once, naming who holds them."""

    enabled: bool = Field(True, description="Lock every node while a layout is deployed.")
    dir: Text | None = Field(
        None,
        description="Directory on each node for the lock files, one per machine "
        "(<hostname>.lock; default: <work_dir>/locks). Runs by different users exclude each "
        "other only if they share this directory (one all of them can write).",
    )


class Logs(StrictModel):
    """Process logs: fetched capped at max_mib (head and tail kept), old run folders pruned."""

    max_mib: Annotated[float, Field(gt=0)] = Field(
        64.0,
        description="Largest log fetched per process (MiB); a longer one keeps its first and "
        "last halves with a line saying how much was cut.",
    )
    keep_runs: NonNegative = Field(
        10, description="Run folders kept in work_dir on each node; older ones removed at start."
    )
    tail_report_s: Annotated[float, Field(ge=0)] = Field(
        60.0,
        description="While a layout is measured: wall seconds (on the machine running pytest) "
        "between reports of each process's last log line, shown only when it changed since "
        "the previous report; 0 turns them off.",
    )
