"""The steps before a deployment starts anything on its nodes, each able to stop the bring-up.

The nodes locked (SSH), the allocation asked for (Slurm), what runs that died left found
(stopped with ``--kimi-reap``), the nodes' addresses resolved, their GPUs checked idle, the
releases they run probed, and every connection the deployment needs checked. Each says what it
found through ``say``; a problem is an error that names every node it concerns, before any
process is started, so a bad cluster fails in seconds rather than after a half-hour start-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.versions import Versions
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.deploy.reach import Reach
    from pytest_kimi.results.layout import LayoutResult

Say = Callable[[str], None]


def node_locks(
    inputs: Inputs,
    plan: DeploymentPlan,
    run_id: str,
    say: Say,
    on_left: Callable[[list[str]], None],
) -> contextlib.AbstractContextManager[None]:
    """Every node the plan uses locked for the deployment's lifetime (SSH clusters): a second
    run on them is refused at once (:class:`~pytest_kimi.deploy.locks.NodeBusy`). Holders
    not confirmed ended at release go to ``on_left``."""
    from pytest_kimi.deploy.locks import holding

    nodes = [spec.node for spec in plan.processes]
    name = plan.layout.name
    if inputs.cluster.executor == "ssh" and inputs.cluster.locks.enabled:
        say(f"[kimi {name}] locking {len({n.name for n in nodes})} nodes")
    return holding(inputs.cluster, nodes, run_id, say=lambda m: say(f"[kimi {name}] {m}"),
                   on_left=on_left)  # fmt: skip


def allocate(
    inputs: Inputs, executor: Executor, plan: DeploymentPlan, run: str, result: LayoutResult,
    say: Say,
) -> DeploymentPlan:  # fmt: skip
    """executor: slurm: jobs an earlier run left in the queue fail bring-up, named (with
    ``--kimi-reap`` they are cancelled); then the layout's allocation, its wait in the queue
    said apart from bring-up. The plan, with the allocation. Other executors: the plan."""
    if inputs.cluster.executor != "slurm":
        return plan
    from pytest_kimi.deploy.slurmjobs import SlurmError, cancel, earlier_jobs
    from pytest_kimi.deploy.waits import BringUpError

    name = plan.layout.name
    nodes = inputs.cluster.deployment_nodes(plan.layout)
    earlier = earlier_jobs(inputs.cluster, [n.name for n in nodes], run)
    dead = [j for j in earlier if j.dead]
    if dead and inputs.options.reap:
        cancel([j.job for j in dead])
        say(f"[kimi {name}] cancelled Slurm jobs a run that died left: "
            f"{'; '.join(j.line for j in dead)}")  # fmt: skip
    elif dead:
        raise BringUpError(
            "Slurm jobs a run of yours that died left are still in the queue, on this "
            f"layout's nodes: {'; '.join(j.line for j in dead)} (id name state nodes); cancel "
            "them (scancel ID) or rerun with --kimi-reap"
        )
    for job in (j for j in earlier if not j.dead):  # a live run's: the queue waits for it
        say(f"[kimi {name}] a Slurm job of another run of yours holds some of these nodes "
            f"(the allocation waits for it): {job.line}")  # fmt: skip
    say(f"[kimi {name}] asking Slurm for {len(nodes)} nodes (waiting at most "
        f"{inputs.cluster.slurm.queue_timeout_s:g} s in the queue)")  # fmt: skip
    try:
        granted = executor.allocate(nodes)  # type: ignore[attr-defined]
    except SlurmError as exc:
        raise BringUpError(str(exc)) from None
    note = (f"slurm: job {granted.job} on {', '.join(granted.nodes)}; {granted.queue_wait_s:.1f} "
            "s in the queue before the nodes were ours (not part of bring-up time)")  # fmt: skip
    result.notes.append(note)
    say(f"[kimi {name}] {note}")
    allocation = {"job": granted.job, "nodes": list(granted.nodes),
                  "queue_wait_s": round(granted.queue_wait_s, 3),
                  "job_name": executor.job_name}  # type: ignore[attr-defined]  # fmt: skip
    return dataclasses.replace(plan, allocation=allocation)


def earlier_runs(inputs: Inputs, executor: Executor, plan: DeploymentPlan, say: Say) -> None:
    """SSH: processes earlier runs left on the plan's nodes fail bring-up, listed; with
    ``--kimi-reap`` they are stopped (:mod:`pytest_kimi.deploy.leftovers`). Local clusters
    are not scanned: their processes die with the harness (the executor's lifeline)."""
    if inputs.cluster.executor != "ssh":
        return
    from pytest_kimi.deploy import leftovers

    leftovers.check(executor, [s.node for s in plan.processes], inputs.cluster.work_dir,
                    reap_them=inputs.options.reap,
                    say=lambda m: say(f"[kimi {plan.layout.name}] {m}"))  # fmt: skip


def node_addresses(
    inputs: Inputs, executor: Executor, say: Say, layout: Layout | None = None
) -> dict[str, str]:
    """The nodes' data-network addresses, resolved on the nodes that have no ``addr``; a
    loopback or unresolvable one is a :class:`~pytest_kimi.deploy.network.NetworkError`."""
    from pytest_kimi.deploy import network

    addrs = network.node_addresses(inputs.cluster, executor, layout)
    if addrs:
        say("[kimi] addresses resolved on the nodes: "
            + ", ".join(f"{name} {addr}" for name, addr in addrs.items()))  # fmt: skip
    return addrs


def gpu_preflight(
    inputs: Inputs, executor: Executor, plan: DeploymentPlan, scope: str, say: Say
) -> list[dict]:
    """Every server node's GPUs counted and idle, or one error listing every problem
    (:class:`~pytest_kimi.deploy.preflight.PreflightError`); returns the manifest's per-node
    records (driver, CUDA, GPUs). The router needs no GPU: its node is checked only when it
    also runs a server."""
    from pytest_kimi.deploy import preflight

    cluster = inputs.cluster
    if not cluster.preflight.enabled:
        return []
    reports = preflight.check_nodes(cluster, [s.node for s in plan.servers], executor, scope)
    preflight.require_clean(reports)
    say(f"[kimi {plan.layout.name}] {preflight.summary(reports)}")
    return [
        {"node": r.node.name, "host": r.node.host, "gpu_preflight": r.manifest()} for r in reports
    ]


def probe_versions(executor: Executor, plan: DeploymentPlan, say: Say) -> Versions:
    """The SGLang release the server nodes run and the router package on the router's node
    (:mod:`pytest_kimi.deploy.versionprobe`); one the plan cannot be built for stops the
    bring-up before anything starts."""
    from pytest_kimi.deploy.versionprobe import VersionMismatch
    from pytest_kimi.deploy.versionprobe import probe_versions as probe
    from pytest_kimi.deploy.waits import BringUpError

    try:
        return probe(executor, plan, say)
    except VersionMismatch as exc:
        raise BringUpError(str(exc)) from None


def network_preflight(
    executor: Executor, plan: DeploymentPlan, say: Say, reach: Reach | None = None
) -> None:
    """Every peer reaches its replica head, the router each head, this machine the router
    (TCP probes from the nodes; :mod:`pytest_kimi.deploy.network`; this machine's through
    ``reach``: the SSH forward in ssh_forward mode), or one error naming all."""
    from pytest_kimi.deploy import network
    from pytest_kimi.deploy.reach import DIRECT

    count = network.check_reachable(plan, executor, (reach or DIRECT).probe)
    if count:
        say(f"[kimi {plan.layout.name}] network pre-flight: {count} connection(s) reachable")
