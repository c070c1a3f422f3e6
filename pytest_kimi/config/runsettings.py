"""What a deployed layout is run with, as frozen records: the workload and the safeguards.

The workload sent (with its parsed goodput limits and the settings it sweeps), and how the
deployment is checked, reached and watched: telemetry, pre-flight, network, watchdog, locks,
logs. Built by :func:`pytest_kimi.config.load_cluster` from
:mod:`~pytest_kimi.config.workloadmodels` and :mod:`~pytest_kimi.config.runmodels`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    # a named workload (workloads: in the cluster file, --kimi-workload): its name, and what
    # it sends: requests (single turns), sessions (from the dataset) or agentic (generated);
    # for sessions num_requests counts sessions and concurrency sessions in flight
    name: str | None = None
    kind: str = "requests"
    turns: int = 6  # agentic: per session
    system_prompt_tokens: int = 2048  # agentic: shared by every session
    task_tokens: int = 256  # agentic: the first turn
    tool_result_tokens: int = 512  # agentic: each later turn
    think_time_s: float = 0.0  # cluster seconds between an answer and the next turn
    think_time_kind: str = "fixed"  # fixed | exponential (seeded)
    trace_speed: float = 1.0  # trace (and arrivals): timestamps divided by this
    arrivals: Path | None = None  # a recorded arrival list (JSONL timestamps, ms) to replay

    @property
    def sessions(self) -> bool:
        """Whether it sends multi-turn sessions."""
        return self.kind in ("sessions", "agentic")


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
