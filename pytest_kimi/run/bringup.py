"""Bring one layout up, hand out its router URL, and always tear it down.

:func:`deployment` is a list of steps (:class:`_Steps`): plan the layout and make its
:class:`~pytest_kimi.deploy.deployment.Deployment`, lock the nodes, prepare them (allocation,
leftovers, addresses, GPUs, releases: :mod:`pytest_kimi.deploy.prestart`), connect this machine
to them, start every node process and the router, record each node's environment in the
manifest, check the router can see the model and warm each replica
(:mod:`pytest_kimi.deploy.poststart`), then sample every node's GPUs and watch every process
while the layout is measured (:mod:`pytest_kimi.deploy.parts`). On the way out (pass,
failure, Ctrl-C, SIGTERM) it stops everything, scans the logs and writes the layout's summary,
so a failed bring-up still leaves a result that says why. What is about the run stays here:
the progress events, the notes and the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pytest_kimi.deploy.parts import (
    executor_for,
    mock_clock,
    node_client,
    node_scope,
    sampler_for,
    watchdog_for,
)
from pytest_kimi.deploy.poststart import (
    node_environments,
    router_model_notes,
    warm_replicas,
    with_gpus,
)
from pytest_kimi.deploy.prestart import (
    allocate,
    earlier_runs,
    gpu_preflight,
    network_preflight,
    node_addresses,
    node_locks,
    probe_versions,
)
from pytest_kimi.deploy.procgroup import Interrupts, interrupt, sigterm_as_interrupt
from pytest_kimi.deploy.runtails import log_lines, tailing
from pytest_kimi.deploy.telemetry import sampling
from pytest_kimi.deploy.watchdog import watching

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.deployment import Deployment
    from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
    from pytest_kimi.deploy.ports import PortBook
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
    from pytest_kimi.deploy.ports import PortBook
    from pytest_kimi.results.events import NoProgress

    steps = _Steps(inputs, layout, folder, result, say, on_manifest, progress or NoProgress(),
                   abort, on_reach, on_client)  # fmt: skip
    with PortBook() as book:  # auto ports stay ours until everything is stopped
        dep = steps.deployment(book)
        lock_left: list[str] = []  # lock holders not confirmed ended at release
        with (
            sigterm_as_interrupt(),
            mock_clock(dep.plan),
            contextlib.ExitStack() as locked,  # released by teardown, once everything is stopped
            _teardown(dep, inputs, layout, folder, result, say, (locked, lock_left)),
            contextlib.ExitStack() as coming_up,
        ):
            # while coming up, a Ctrl-C that a library swallows is acted on at the next poll
            coming_up.enter_context(dep.interrupts.raised())
            locked.enter_context(node_locks(inputs, dep.plan, steps.scope, say,
                                            lock_left.extend))  # fmt: skip
            gpus = steps.prepare(dep, book)
            steps.connect(dep)
            steps.start(dep, gpus)
            coming_up.close()  # raises a swallowed one; from here Ctrl-C is asyncio's (it
            # cancels the requests)
            steps.client(dep)
            with steps.watched(dep):
                yield dep.plan  # measured while every node's GPUs are sampled and its processes
                # watched


@dataclasses.dataclass
class _Steps:
    """The steps of one layout's bring-up, in the order :func:`deployment` runs them, and what
    they share: the run's side of it (its inputs, folder, result and callbacks). The
    :class:`~pytest_kimi.deploy.deployment.Deployment` each step is given keeps its own plan
    and reach."""

    inputs: Inputs
    layout: Layout
    folder: RunFolder
    result: LayoutResult
    say: Say
    on_manifest: Callable[[DeploymentPlan | None, list[dict] | None], None]
    progress: Progress
    abort: Abort | None
    on_reach: Callable[[Reach], None]
    on_client: Callable[[NodeClient], None]

    @property
    def scope(self) -> str:
        """This run's layout on the nodes (:func:`~pytest_kimi.deploy.parts.node_scope`)."""
        return node_scope(self.inputs, self.folder, self.layout)

    def deployment(self, book: PortBook) -> Deployment:
        """The plan from the cluster file alone (to the manifest), and the deployment that will
        run it, saying its progress as this layout's."""
        from pytest_kimi.deploy.deployment import Deployment
        from pytest_kimi.deploy.plan import plan_deployment

        inputs, layout = self.inputs, self.layout
        plan = plan_deployment(inputs.cluster, layout, book=book, gpu_scope=self.scope)
        self.on_manifest(plan, None)
        executor = executor_for(inputs, self.folder, layout)
        return Deployment(
            plan,
            executor,
            self.folder.logs(layout.name),
            timeout_s=inputs.cluster.startup_timeout_s,
            progress=lambda m: self.say(f"[kimi {layout.name}] {m}"),
            on_state=node_events(layout.name, self.progress),
            stall_s=inputs.cluster.startup_stall_s,
            report_s=inputs.cluster.startup_report_s,
            on_log=node_log_events(layout.name, self.progress),
            log_max_bytes=inputs.cluster.logs.max_bytes,
            keep_runs=inputs.cluster.logs.keep_runs,
            interrupts=Interrupts(),
        )

    def prepare(self, dep: Deployment, book: PortBook) -> list[dict]:
        """The nodes (locked) asked before anything is written on them: the allocation, what
        dead runs left, their addresses, their GPUs, their releases; then the plan made again
        for what they said. Returns the GPU pre-flight records."""
        from pytest_kimi.deploy.plan import plan_deployment

        inputs, executor, say = self.inputs, dep.executor, self.say
        plan = dep.use_plan(allocate(inputs, executor, dep.plan, self.folder.name, self.result,
                                     say))  # fmt: skip
        self.on_manifest(plan, None)
        # after the lock: a live run holds it, so what is found now was left by a dead one
        earlier_runs(inputs, executor, plan, say)
        addrs = node_addresses(inputs, executor, say, self.layout)
        # the GPUs first: a busy node is refused before anything is written on any node
        gpus = gpu_preflight(inputs, executor, plan, self.scope, say)
        self.on_manifest(plan, gpus or None)
        versions = probe_versions(executor, plan, say)
        self.result.notes.extend(versions.notes)
        # the plan again, on the addresses the nodes gave (ssh: fixed ports), for the
        # releases they run
        plan = dep.use_plan(dataclasses.replace(plan_deployment(
            inputs.cluster, self.layout, book=book, gpu_scope=self.scope, addrs=addrs,
            versions=versions,
        ), allocation=plan.allocation))  # fmt: skip
        self.on_manifest(plan, gpus or None)
        return gpus

    def connect(self, dep: Deployment) -> None:
        """How this machine reaches the plan's URLs (to ``on_reach``; closed by ``dep.stop()``),
        then every connection the deployment needs checked."""
        reach = dep.open_reach()
        self.on_reach(reach)
        if reach.mode == "ssh_forward" and self.inputs.cluster.network.client == "ssh_forward":
            self.result.notes.append(FORWARD_NOTE)
        network_preflight(dep.executor, dep.plan, self.say, reach)

    def start(self, dep: Deployment, gpus: list[dict]) -> None:
        """Every process up; then each node's environment to the manifest, the router's model
        checked and every replica warm (the end of bring-up, to ``progress``)."""
        from pytest_kimi.results.events import BringUpDone

        inputs, layout = self.inputs, self.layout
        shape = layout.label  # a disaggregated label counts each side's replicas
        if not layout.disaggregated:
            shape += f" x{inputs.cluster.replicas_of(layout)}"
        self.say(f"[kimi {layout.name}] bringing up {shape}")
        dep.start()
        plan, executor = dep.plan, dep.executor
        environments = with_gpus(
            node_environments(inputs, executor, plan, self.scope, dep.reach), gpus
        )
        self.on_manifest(plan, environments)
        self.result.notes.extend(router_model_notes(inputs, executor, plan))
        warm_replicas(plan, dep.reach)
        self.progress.emit(BringUpDone(layout.name))

    def client(self, dep: Deployment) -> None:
        """The benchmark client on a node (``network.client: on_node``), to ``on_client``."""
        client = node_client(self.inputs, dep.executor, dep, dep.plan)
        if client is not None:
            self.on_client(client)

    @contextlib.contextmanager
    def watched(self, dep: Deployment) -> Iterator[None]:
        """While inside (measured): every node's GPUs sampled, every process and the router's
        workers watched (a loss trips ``abort``), the processes' log lines reported; what they
        saw goes on the result on the way out."""
        inputs, executor, result = self.inputs, dep.executor, self.result
        watchdog = watchdog_for(inputs, executor, dep, self.abort)
        tails = log_lines(executor, list(dep.handles.values()), self.layout.name, self.progress,
                          inputs.cluster.logs.tail_report_s)  # fmt: skip
        with (
            sampling(sampler_for(inputs, executor, dep.plan, self.folder, self.layout), result),
            watching(watchdog, result),
            tailing(tails, result),
        ):
            yield


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
    from pytest_kimi.deploy.teardown import killed_note
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
        cached = result.summary.cached_tokens_total if result.summary else None
        result.notes.extend(quality_notes(findings, result.replica_counters, replicas, succeeded,
                                          cached))  # fmt: skip
        if dep.killed:
            result.notes.append(killed_note(dep.killed, dep.grace_s))
        if leftovers:
            result.notes.append("processes left running after teardown: " + ", ".join(leftovers))
        folder.write_summary(result, inputs.backend, inputs.time_scale)
        if dep.held_signal is not None and not failing:
            raise interrupt(dep.held_signal)
