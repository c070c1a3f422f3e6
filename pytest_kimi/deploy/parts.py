"""The parts a layout's deployment runs with, each made from the cluster file.

The executor that starts processes on the nodes (local, SSH, Slurm), the shared clock of a
local mock run, and, once the deployment is up, the benchmark client on a node
(``network.client: on_node``), the GPU sampler and the watchdog. A part the cluster file turns
off is None, and whoever uses it skips it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pytest_kimi.deploy.telemetry import Sampler
from pytest_kimi.deploy.watchdog import Watchdog, abort_on_loss

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.deployment import Deployment
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.results.store import RunFolder
    from pytest_kimi.workload.abort import Abort


def node_scope(inputs: Inputs, folder: RunFolder, layout: Layout) -> str:
    """This run's layout on the nodes (``<run>/<layout>``): the GPU scope, the node locks,
    the executor's remote folder and the telemetry's stand-in nvidia-smi all name it.

    On a local cluster every "node" is this machine, which other runs may share at the same
    moment (another checkout, another user, the suite under xdist) with a run folder of the
    same name: a name is unique under one reports folder only, and two runs of one cluster
    file started in the same second get the same one. The harness's pid keeps their mock
    clocks and GPU folders apart."""
    run = folder.name
    if not inputs.cluster.remote:
        run = f"{run}.{os.getpid()}"
    return f"{run}/{layout.name}"


def executor_for(inputs: Inputs, folder: RunFolder, layout: Layout) -> Executor:
    """The executor the cluster file names, for this run's layout."""
    from pytest_kimi.deploy.executor import LocalExecutor
    from pytest_kimi.deploy.slurm import SlurmExecutor
    from pytest_kimi.deploy.ssh import SSHExecutor

    if inputs.cluster.executor == "slurm":
        return SlurmExecutor(inputs.cluster, node_scope(inputs, folder, layout))
    if inputs.cluster.executor == "ssh":
        return SSHExecutor(inputs.cluster.work_dir, node_scope(inputs, folder, layout),
                           max_s=inputs.cluster.deployment_max_s)  # fmt: skip
    return LocalExecutor()


@contextlib.contextmanager
def mock_clock(plan: DeploymentPlan) -> Iterator[None]:
    """A local mock run's shared cluster clock (pytest_kimi/workload/sharedclock.py): made before
    any server starts (they open it), removed once everything is stopped."""
    from pathlib import Path

    from pytest_kimi.workload.sharedclock import SharedClock

    if plan.mock_clock is None:
        yield
        return
    path = Path(plan.mock_clock)
    SharedClock.create(path, plan.cluster.time_scale).close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # <work_dir>/mock-clock/<run>/<layout>, <run>
            path.parent.rmdir()
            path.parent.parent.rmdir()


def node_client(
    inputs: Inputs, executor: Executor, dep: Deployment, plan: DeploymentPlan
) -> NodeClient | None:
    """The benchmark client on ``network.client_node``, or None (it runs here)."""
    from pytest_kimi.deploy.clientnode import NodeClient

    network = inputs.cluster.network
    if network.client != "on_node":
        return None
    node = next(n for n in inputs.cluster.nodes if n.name == network.client_node)
    local = inputs.cluster.executor != "ssh"
    folder = str((dep.log_dir / "client").absolute()) if local else executor.remote_dir  # type: ignore[attr-defined]

    return NodeClient(executor, node, network.client_python, folder, plan.endpoint,
                      dep.start_extra, same_clock=local)  # fmt: skip


def sampler_for(
    inputs: Inputs, executor: Executor, plan: DeploymentPlan, folder: RunFolder, layout: Layout
) -> Sampler | None:
    """The GPU sampler of every node the plan uses (None when the cluster file turns it off)."""
    from pytest_kimi.config.cluster import SUBMIT_HOST
    from pytest_kimi.deploy.gpus import query_gpus, smi_command

    config = inputs.cluster.telemetry
    if not config.enabled:
        return None
    nodes = list(
        {
            spec.node.name: spec.node for spec in plan.processes if spec.node.name != SUBMIT_HOST
        }.values()
    )  # GPU nodes, not a submit host
    scope = node_scope(inputs, folder, layout)
    commands = {n.name: query_gpus(smi_command(inputs.cluster, n, scope)) for n in nodes}
    return Sampler(executor, nodes, commands, folder.telemetry_path(layout.name),
                   interval_s=config.interval_s, time_scale=inputs.time_scale,
                   stamp=_stamp_clock(plan))  # fmt: skip


def _stamp_clock(plan: DeploymentPlan) -> Callable[[], float] | None:
    """The shared clock's reading for telemetry samples (its own handle: the sampler runs in a
    thread, and a lock is per open file), or None: wall time."""
    if plan.mock_clock is None:
        return None
    from pytest_kimi.workload.sharedclock import SharedClock

    return SharedClock(plan.mock_clock).now


def watchdog_for(
    inputs: Inputs, executor: Executor, dep: Deployment, abort: Abort | None
) -> Watchdog | None:
    """The watchdog of a deployment that is up (None when the cluster file turns it off)."""
    config = inputs.cluster.watchdog
    if not config.enabled:
        return None
    plan = dep.plan
    on_lost = abort_on_loss(abort) if abort is not None else (lambda problem: None)
    return Watchdog(executor, list(dep.handles.values()), on_lost, interval_s=config.interval_s,
                    readiness_url=dep.reach.url(plan.router.url + "/readiness"),
                    replicas=len(plan.rank0()),
                    misses=config.misses)  # fmt: skip
