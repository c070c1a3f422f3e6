"""The cluster file as pydantic models: the single description of what the YAML may hold.

These models check each field on its own (types, ranges, names, unknown keys) and are the
source of the published JSON Schema (``python -m pytest_kimi.config.schema``). Checks that relate
fields to each other, or need the SLO/baseline/mock parsers, live in
:mod:`pytest_kimi.config.checks`; :mod:`pytest_kimi.config.load` turns a validated model into
the frozen records callers use.

The top-level file model is here; each section's models live in a module of their own:
:mod:`~pytest_kimi.config.nodemodels` (nodes, ssh, slurm, deployment),
:mod:`~pytest_kimi.config.layoutmodels` (layouts), :mod:`~pytest_kimi.config.processmodels`
(server, router, mock), :mod:`~pytest_kimi.config.workloadmodels` (workload) and
:mod:`~pytest_kimi.config.runmodels` (telemetry, preflight, network, watchdog, locks, logs).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from pytest_kimi.config.fields import (
    Argv,
    LayoutMap,
    LayoutName,
    NodeList,
    Seconds,
    Text,
    TextValue,
    one_of,
)
from pytest_kimi.config.layoutmodels import LayoutModel
from pytest_kimi.config.nodemodels import SSH, Deployment, NodeModel, Slurm
from pytest_kimi.config.processmodels import Mock, Router, Server
from pytest_kimi.config.runmodels import Locks, Logs, Network, Preflight, Telemetry, Watchdog
from pytest_kimi.config.strictmodel import StrictModel
from pytest_kimi.config.workloadmodels import NamedWorkload, Workload

SLOS = (
    "SLO limits by metric, e.g. ttft_p95: 25s, tpot_mean: 150ms, success_rate: 0.99; and "
    "confidence: 0.95 to judge each SLO by its bounds at that confidence (passed, failed or "
    "undecided; docs/metrics.md)."
)


class ClusterFile(StrictModel):
    """A pytest-kimi cluster file: nodes, how to start SGLang and the router, the layouts,
    the workload and the SLOs. See docs/cluster-file.md."""

    model_config = ConfigDict(title="pytest-kimi cluster file")

    name: Text = Field(description="Cluster name, shown in reports.")
    executor: one_of("local", "ssh", "slurm") = Field(
        "local",
        description="local: processes on this machine; ssh: on the nodes over SSH; slurm: "
        "steps of a Slurm allocation (salloc, srun) on the nodes.",
    )
    work_dir: Text = Field(
        "/var/tmp/pytest-kimi",
        description="On each node: logs and exit codes of our processes (/var/tmp survives a "
        "reboot; /tmp may not).",
    )
    ssh: SSH = Field(default_factory=SSH, description="SSH defaults for every node.")
    slurm: Slurm | None = Field(None, description=Slurm.__doc__)
    nodes: Annotated[list[NodeModel], NodeList] = Field(
        description="The machines, in order.", json_schema_extra={"minItems": 1}
    )
    deployment: Deployment = Field(description=Deployment.__doc__)
    layouts: Annotated[dict[LayoutName, LayoutModel], LayoutMap] = Field(
        description="Parallel layouts by name (the --layout choices).",
        json_schema_extra={"minProperties": 1},
    )
    server: Server = Field(description=Server.__doc__)
    router: Router = Field(description=Router.__doc__)
    workload: Workload = Field(description=Workload.__doc__)
    workloads: dict[LayoutName, NamedWorkload] = Field(
        default_factory=dict,
        description="Other workloads by name, each over `workload` (--kimi-workload NAME).",
    )
    slo: dict[str, TextValue] = Field(default_factory=dict, description=SLOS)
    regression: dict[str, TextValue] = Field(
        default_factory=dict,
        description="Regression gate thresholds by metric, e.g. ttft_p95: 10% (or 0.1).",
    )
    history: Text | None = Field(
        None,
        description="History file (SQLite) every run is appended to, relative to this file; "
        "--kimi-history overrides it. Read it with python -m pytest_kimi.judge.history.",
    )
    mock: Mock | None = Field(None, description="Present for the embedded mock backend.")
    startup_timeout_s: Seconds = Field(900.0, description="Seconds a deployment may take to start.")
    startup_stall_s: Seconds = Field(
        600.0,
        description="A process still starting whose log has not grown for this many seconds "
        "(while it runs) fails the bring-up as stalled.",
    )
    startup_report_s: Seconds = Field(
        60.0, description="Seconds between bring-up reports (each process's state, last log line)."
    )
    logs: Logs = Field(default_factory=Logs, description=Logs.__doc__)
    deployment_max_s: Seconds = Field(
        43200.0,
        description="SSH: the longest any process on the nodes may live (a dead man's switch: "
        "coreutils timeout on each node, TERM then KILL 30 s later), so a killed harness cannot "
        "leave the cluster busy for ever. Size it above bring-up plus the longest run.",
    )
    telemetry: Telemetry = Field(default_factory=Telemetry, description=Telemetry.__doc__)
    preflight: Preflight = Field(default_factory=Preflight, description=Preflight.__doc__)
    network: Network = Field(default_factory=Network, description=Network.__doc__)
    watchdog: Watchdog = Field(default_factory=Watchdog, description=Watchdog.__doc__)
    locks: Locks = Field(default_factory=Locks, description=Locks.__doc__)
    nvidia_smi: Argv = Field(
        default_factory=list,
        description="The nvidia-smi to run on the nodes, as argv (default: [nvidia-smi]; "
        "ignored on the embedded mock, which ships a stand-in).",
    )
