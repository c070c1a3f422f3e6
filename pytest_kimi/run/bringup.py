"""Bring one layout up, hand out its router URL, and always tear it down.

Start every node process and the router (:class:`~pytest_kimi.deploy.deployment.Deployment`),
record each node's environment in the manifest, check the router can see the model, warm each
replica, sample every node's GPUs while the layout is measured
(:mod:`pytest_kimi.deploy.telemetry`), and on the way out (pass, failure, Ctrl-C, SIGTERM) stop
everything, scan the logs and write the layout's summary, so a failed bring-up still leaves a
result that says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from pytest_kimi.deploy.procgroup import Interrupts, interrupt, sigterm_as_interrupt
from pytest_kimi.deploy.runtails import log_lines, tailing
from pytest_kimi.deploy.telemetry import Sampler, sampling
from pytest_kimi.deploy.watchdog import Watchdog, abort_on_loss, watching

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.versions import Versions
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.deployment import Deployment
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
    from pytest_kimi.deploy.reach import Reach
    from pytest_kimi.results.events import Progress
    from pytest_kimi.results.layout import LayoutResult
    from pytest_kimi.results.store import RunFolder
    from pytest_kimi.workload.abort import Abort

Say = Callable[[str], None]
FORWARD_NOTE = (
    "network.client: ssh_forward: the client reached the router through an SSH forward "
    "(and the jump host, if any): latencies include that tunnel"
)


@contextlib.contextmanager
def deployment(
    inputs: Inputs,
    layout: Layout,
    folder: RunFolder,
    result: LayoutResult,
    say: Say,
    on_manifest: Callable[[DeploymentPlan | None, list[dict] | None], None],
    progress: Progress | None = None,
    abort: Abort | None = None,
    on_reach: Callable[[Reach], None] = lambda reach: None,
    on_client: Callable[[NodeClient], None] = lambda client: None,
) -> Iterator[DeploymentPlan]:
    """The layout's deployment, up and warm; yields its plan (``plan.endpoint`` is the router).

    ``on_manifest`` is called with what is known so far: the plan before launch, then the nodes'
    environments once they are up. ``progress`` gets each process's state and the end of
    bring-up (warm-up done). While yielded, a watchdog polls every process and the router's
    workers; a loss trips ``abort`` (the measured run's cancel hook, :func:`measure`).
    ``on_reach`` gets how this machine reaches the plan's URLs (``network.client``:
    :mod:`pytest_kimi.deploy.reach`) before anything is started; it is closed at teardown.
    ``on_client`` gets the client on a node (``network.client: on_node``) once warm."""
    from pytest_kimi.deploy.deployment import Deployment
    from pytest_kimi.deploy.plan import plan_deployment
    from pytest_kimi.deploy.ports import PortBook
    from pytest_kimi.deploy.reach import reach_for
    from pytest_kimi.results.events import BringUpDone, NoProgress

    interrupts = Interrupts()
    with PortBook() as book:  # auto ports stay ours until everything is stopped
        plan = plan_deployment(
            inputs.cluster, layout, book=book, gpu_scope=f"{folder.name}/{layout.name}"
        )
        on_manifest(plan, None)
        executor = _executor(inputs, folder, layout)
        dep = Deployment(
            plan,
            executor,
            folder.logs(layout.name),
            timeout_s=inputs.cluster.startup_timeout_s,
            progress=lambda m: say(f"[kimi {layout.name}] {m}"),
            on_state=node_events(layout.name, progress or NoProgress()),
            stall_s=inputs.cluster.startup_stall_s,
            report_s=inputs.cluster.startup_report_s,
            on_log=node_log_events(layout.name, progress or NoProgress()),
            log_max_bytes=inputs.cluster.logs.max_bytes,
            keep_runs=inputs.cluster.logs.keep_runs,
            interrupts=interrupts,
        )
        lock_left: list[str] = []  # lock holders not confirmed ended at release
        with (
            sigterm_as_interrupt(),
            _mock_clock(plan),
            contextlib.ExitStack() as locked,  # released by teardown, once everything is stopped
            _teardown(dep, inputs, layout, folder, result, say, (locked, lock_left)),
            contextlib.ExitStack() as coming_up,
        ):
            # while coming up, a Ctrl-C that a library swallows is acted on at the next poll
            coming_up.enter_context(interrupts.raised())
            locked.enter_context(_node_locks(inputs, plan, f"{folder.name}/{layout.name}", say,
                                             lock_left.extend))  # fmt: skip
            plan = dep.plan = allocate(inputs, executor, plan, folder.name, result, say)
            on_manifest(plan, None)
            # after the lock: a live run holds it, so what is found now was left by a dead one
            earlier_runs(inputs, executor, plan, say)
            addrs = node_addresses(inputs, executor, say, layout)
            # the GPUs first: a busy node is refused before anything is written on any node
            gpus = gpu_preflight(inputs, executor, plan, f"{folder.name}/{layout.name}", say)
            on_manifest(plan, gpus or None)
            versions = probe_versions(executor, plan, say)
            result.notes.extend(versions.notes)
            # the plan again, on the addresses the nodes gave (ssh: fixed ports), for the
            # releases they run
            scope = f"{folder.name}/{layout.name}"
            plan = dep.plan = dataclasses.replace(plan_deployment(
                inputs.cluster, layout, book=book, gpu_scope=scope, addrs=addrs,
                versions=versions,
            ), allocation=plan.allocation)  # fmt: skip
            on_manifest(plan, gpus or None)
            reach = dep.reach = reach_for(plan, executor)  # closed by dep.stop()
            on_reach(reach)
            if reach.mode == "ssh_forward" and inputs.cluster.network.client == "ssh_forward":
                result.notes.append(FORWARD_NOTE)
            network_preflight(executor, plan, say, reach)
            shape = layout.label  # a disaggregated label counts each side's replicas
            if not layout.disaggregated:
                shape += f" x{inputs.cluster.replicas_of(layout)}"
            say(f"[kimi {layout.name}] bringing up {shape}")
            dep.start()
            environments = _with_gpus(
                _node_environments(inputs, executor, plan, f"{folder.name}/{layout.name}", reach),
                gpus,
            )
            on_manifest(plan, environments)
            result.notes.extend(_router_model_notes(inputs, executor, plan))
            warm_replicas(plan, reach)
            (progress or NoProgress()).emit(BringUpDone(layout.name))
            coming_up.close()  # raises a swallowed one; from here Ctrl-C is asyncio's (it
            # cancels the requests)
            client = node_client(inputs, executor, dep, plan)
            if client is not None:
                on_client(client)
            watchdog = _watchdog(inputs, executor, dep, abort)
            tails = log_lines(executor, list(dep.handles.values()), layout.name,
                              progress or NoProgress(),
                              inputs.cluster.logs.tail_report_s)  # fmt: skip
            with (
                sampling(_sampler(inputs, executor, plan, folder, layout), result),
                watching(watchdog, result),
                tailing(tails, result),
            ):
                yield plan  # measured while every node's GPUs are sampled and its processes watched


@contextlib.contextmanager
def _mock_clock(plan: DeploymentPlan) -> Iterator[None]:
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


def probe_versions(executor: Executor, plan: DeploymentPlan, say: Say) -> Versions:
    """The SGLang release the server nodes run and the router package on the router's node
    (:mod:`pytest_kimi.deploy.versionprobe`); one the plan cannot be built for stops the
    bring-up before anything starts."""
    from pytest_kimi.deploy.deployment import BringUpError
    from pytest_kimi.deploy.versionprobe import VersionMismatch
    from pytest_kimi.deploy.versionprobe import probe_versions as probe

    try:
        return probe(executor, plan, say)
    except VersionMismatch as exc:
        raise BringUpError(str(exc)) from None


def allocate(
    inputs: Inputs, executor: Executor, plan: DeploymentPlan, run: str, result: LayoutResult,
    say: Say,
) -> DeploymentPlan:  # fmt: skip
    """executor: slurm: jobs an earlier run left in the queue fail bring-up, named (with
    ``--kimi-reap`` they are cancelled); then the layout's allocation, its wait in the queue
    said apart from bring-up. The plan, with the allocation. Other executors: the plan."""
    if inputs.cluster.executor != "slurm":
        return plan
    from pytest_kimi.deploy.deployment import BringUpError
    from pytest_kimi.deploy.slurm import SlurmError, cancel, earlier_jobs

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


def _with_gpus(environments: list[dict], gpus: list[dict]) -> list[dict]:
    """Each node's environment with its pre-flight record (driver, CUDA, GPUs) added."""
    by_node = {g["node"]: g["gpu_preflight"] for g in gpus}
    for env in environments:
        if env.get("node") in by_node:
            env["gpu_preflight"] = by_node[env["node"]]
    return environments


def node_events(layout: str, progress: Progress) -> Callable[[ProcessSpec, str, str], None]:
    """Deployment's ``on_state(spec, state, detail)`` as progress events of ``layout``."""
    from pytest_kimi.results.events import NodeChanged

    def on_state(spec: ProcessSpec, state: str, detail: str = "") -> None:
        progress.emit(
            NodeChanged(layout, spec.name, spec.node.name, spec.role, spec.replica, spec.rank,
                        state, detail)  # type: ignore[arg-type]
        )  # fmt: skip

    return on_state


def node_log_events(layout: str, progress: Progress) -> Callable[[ProcessSpec, str, str], None]:
    """Deployment's ``on_log(spec, state, last log line)`` as :class:`NodeLog` events."""
    from pytest_kimi.results.events import NodeLog

    def on_log(spec: ProcessSpec, state: str, line: str) -> None:
        progress.emit(
            NodeLog(layout, spec.name, spec.node.name, spec.role, spec.replica, spec.rank,
                    state, line)
        )  # fmt: skip

    return on_log


def _executor(inputs: Inputs, folder: RunFolder, layout: Layout) -> Executor:
    from pytest_kimi.deploy.executor import LocalExecutor
    from pytest_kimi.deploy.slurm import SlurmExecutor
    from pytest_kimi.deploy.ssh import SSHExecutor

    if inputs.cluster.executor == "slurm":
        return SlurmExecutor(inputs.cluster, f"{folder.name}/{layout.name}")
    if inputs.cluster.executor == "ssh":
        return SSHExecutor(inputs.cluster.work_dir, f"{folder.name}/{layout.name}",
                           max_s=inputs.cluster.deployment_max_s)  # fmt: skip
    return LocalExecutor()


def _sampler(
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
    scope = f"{folder.name}/{layout.name}"
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


def _node_locks(
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


def _watchdog(
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


@contextlib.contextmanager
def _teardown(
    dep: Deployment,
    inputs: Inputs,
    layout: Layout,
    folder: RunFolder,
    result: LayoutResult,
    say: Say,
    locks: tuple[contextlib.ExitStack, list[str]],
) -> Iterator[None]:
    """Whatever happens inside: record why it failed, stop everything, release the nodes'
    ``locks``, write the summary. A Ctrl-C held during a clean teardown is delivered once
    everything is stopped."""
    from pytest_kimi.report.dataquality import notes as quality_notes
    from pytest_kimi.report.dataquality import scan_logs

    failing = False
    try:
        yield
    except BaseException as exc:
        failing = True
        if not result.error:
            result.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        leftovers = list(dep.stop())
        held, left = locks
        held.close()  # the holders not confirmed ended land in ``left``
        leftovers += left
        say(f"[kimi {layout.name}] torn down; logs in {dep.log_dir}")
        findings = scan_logs(dep.log_dir, dep.log_marks)
        succeeded = sum(1 for r in result.records if r.success and not r.warmup)
        replicas = inputs.cluster.replicas_of(layout)
        result.notes.extend(quality_notes(findings, result.replica_counters, replicas, succeeded))
        if dep.killed:
            result.notes.append(killed_note(dep.killed, dep.grace_s))
        if leftovers:
            result.notes.append("processes left running after teardown: " + ", ".join(leftovers))
        folder.write_summary(result, inputs.backend, inputs.time_scale)
        if dep.held_signal is not None and not failing:
            raise interrupt(dep.held_signal)


def killed_note(names: list[str], grace_s: float) -> str:
    """Processes that outlived SIGTERM: SGLang drains its requests before it exits, and a
    request that can never finish (a decode server waiting for KV that never comes) keeps it
    draining for ever; after ``grace_s`` teardown killed them, with their children."""
    return (
        f"teardown: {', '.join(names)} still running {grace_s:g} s after SIGTERM (SGLang "
        "drains its requests before exiting): killed with SIGKILL"
    )


def _node_environments(
    inputs: Inputs, executor: Executor, plan: DeploymentPlan, scope: str, reach: Reach
) -> list[dict]:
    """Per node: hostname, Python, SGLang, GPUs, driver, the variables we set; the router's
    node also the versions its own interpreter sees (``router_software``), each replica's
    head the version its SGLang states over HTTP (``sglang_server_version``). Versions are
    asked the way each process runs (its environment, setup lines and container). Every node
    at once, one thread per node (as the GPU pre-flight): four SSH round trips per node, in
    sequence over 8 nodes, held each bring-up up ~15 s."""
    from pytest_kimi.deploy.envinfo import node_environment, server_version, software
    from pytest_kimi.deploy.gpus import smi_command

    first: dict[str, ProcessSpec] = {}  # the node's first process: the one its probes use
    for spec in plan.processes:
        first.setdefault(spec.node.name, spec)

    def probe(spec: ProcessSpec) -> dict:
        return node_environment(executor, spec, smi_command(inputs.cluster, spec.node, scope))

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(first)))) as pool:
        seen = dict(zip(first, pool.map(probe, first.values()), strict=True))
    router = plan.router
    seen[router.node.name]["router_software"] = software(executor, router)
    for spec in plan.rank0():
        seen[spec.node.name]["sglang_server_version"] = server_version(reach.url(spec.url))
    return list(seen.values())


def _router_model_notes(inputs: Inputs, executor: Executor, plan: DeploymentPlan) -> list[str]:
    """The router loads each worker's tokenizer from its model path: is it there?"""
    from pytest_kimi.config.serverargs import resolve_model_path

    cluster = inputs.cluster
    path = cluster.router.model_mount or resolve_model_path(cluster.server.model_path)
    code, _ = executor.run(plan.router.node, f"test -d {shlex.quote(path)}", 30)
    if code == 0:
        return []
    return [
        f"router host {plan.router.node.name} has no {path}: the router cannot load the "
        "workers' tokenizer (harmless for round_robin); mount the model read-only there"
    ]


class WarmupFailed(RuntimeError):
    """A replica failed its warm-up: the run stops before measuring, with the response."""


FAKE_BOOTSTRAP_HOST = "2.2.2.2"
"""SGLang 0.5.9's (``srt/disaggregation/utils.py``): a request to one side of a disaggregated
deployment naming it as its bootstrap host moves no KV; SGLang's own health check sends it."""


def warm_replicas(plan: DeploymentPlan, reach: Reach | None = None) -> None:
    """One short request per replica, straight to rank 0 (not through the router); to a
    prefill or decode server as SGLang's own health check sends one (no KV to move)."""
    import httpx

    from pytest_kimi.deploy.reach import DIRECT

    body = {"text": "warm up", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    alone = {"bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": 0}
    with httpx.Client(timeout=600.0, trust_env=False) as http:
        for spec in plan.rank0():
            sent = {**body, **alone} if spec.disaggregation else body
            response = http.post((reach or DIRECT).url(spec.url + "/generate"), json=sent)
            if response.status_code != 200:
                raise WarmupFailed(
                    f"warm-up of replica {spec.replica} ({spec.url}/generate) answered HTTP "
                    f"{response.status_code}: {response.text[:300]}"
                )
