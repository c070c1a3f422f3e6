"""Bring a plan up, keep it healthy, and tear it down whatever happens.

Start-up order is an engineer's: every node's server, then (once each replica's rank 0
answers ``/health`` and ``/model_info``) the router, then wait for the router's
``/readiness`` to count every replica. Any process that exits while we wait fails the
bring-up at once, naming the node and showing the end of its log (the waits:
:mod:`pytest_kimi.deploy.waits`). ``stop`` signals every process group, collects the logs and
verifies nothing is left running (its steps: :mod:`pytest_kimi.deploy.teardown`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from pytest_kimi.deploy import teardown
from pytest_kimi.deploy.executor import Executor, Handle
from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
from pytest_kimi.deploy.procgroup import Interrupts, hold_signals, interrupt, stop_all
from pytest_kimi.deploy.reach import DIRECT, Reach, reach_for
from pytest_kimi.deploy.readiness import router_counts, router_metrics_known
from pytest_kimi.deploy.startup import StartupWatch
from pytest_kimi.deploy.waits import BringUpError, StartupWait, check_ports, with_every_tail
from pytest_kimi.workload import http

POLL_S = 0.1


class Deployment:
    """One layout's running deployment (servers + router) on an executor."""

    def __init__(
        self,
        plan: DeploymentPlan,
        executor: Executor,
        log_dir: Path,
        *,
        timeout_s: float,
        grace_s: float = 10.0,
        progress: Callable[[str], None] = lambda message: None,
        on_state: Callable[[ProcessSpec, str, str], None] = lambda spec, state, detail: None,
        stall_s: float | None = None,
        report_s: float = 60.0,
        on_log: Callable[[ProcessSpec, str, str], None] = lambda spec, state, line: None,
        log_max_bytes: int | None = None,
        keep_runs: int | None = None,
        reach: Reach = DIRECT,
        interrupts: Interrupts | None = None,
    ) -> None:
        self.plan, self.executor, self.log_dir = plan, executor, log_dir
        # a Ctrl-C that a library swallowed is raised again at the next poll (procgroup)
        self.interrupts = interrupts or Interrupts()
        self.timeout_s, self.grace_s, self.progress = timeout_s, grace_s, progress
        # each process's bring-up state: starting, healthy, ready, failed (with a URL / reason)
        self.on_state = on_state
        self.handles: dict[str, Handle] = {}
        self.launching: ProcessSpec | None = None  # between "start it" and "got its handle"
        self.poll_s = getattr(executor, "poll_s", POLL_S)
        self.leftovers: list[str] = []
        self.killed: list[str] = []  # processes still running grace_s after SIGTERM: KILLed
        self.log_marks: dict[str, int] = {}  # log file name -> its size when teardown began
        self.held_signal: int | None = None  # Ctrl-C / SIGTERM that arrived during teardown
        self.started_at = 0.0
        self.ready_s = 0.0
        # start-up watch: a live process whose log is silent for stall_s fails the bring-up
        # (None: only the hard cap); every report_s each process's state and last log line
        self.stall_s, self.report_s, self.on_log = stall_s, report_s, on_log
        self.log_max_bytes, self.keep_runs = log_max_bytes, keep_runs
        self.pruned: list[str] = []  # earlier run folders removed from the nodes at start
        # node URL -> the URL this machine uses (network.client; closed in stop())
        self.reach = reach

    # -- before bring-up -----------------------------------------------------------------
    def use_plan(self, plan: DeploymentPlan) -> DeploymentPlan:
        """The plan made again once the nodes are known (their allocation, the addresses they
        gave, the releases they run): the one :meth:`start` launches. Returns it."""
        self.plan = plan
        return plan

    def open_reach(self) -> Reach:
        """How this machine reaches the plan's URLs (``network.client``:
        :mod:`pytest_kimi.deploy.reach`), made for the plan as it is now; :meth:`stop`
        closes it. Returns it."""
        self.reach = reach_for(self.plan, self.executor)
        return self.reach

    # -- bring-up ------------------------------------------------------------------------
    def start(self) -> None:
        """Start everything and wait until the router serves every replica. A failure names
        the process and shows its log's end, then every other process's last lines (all of
        them are written to ``startup-failure.txt`` beside the logs)."""
        self.interrupts.check()  # one swallowed before now: start nothing
        self.started_at = time.monotonic()
        deadline = self.started_at + self.timeout_s
        check_ports(self.executor, self.plan)
        self._prune()
        watch = StartupWatch(
            self.executor,
            stall_s=self.stall_s if self.stall_s is not None else float("inf"),
            report_s=self.report_s,
            report=lambda handle, state, line: self.on_log(handle.spec, state, line),
        )
        wait = StartupWait(self.executor, self.handles, watch, deadline=deadline,
                           timeout_s=self.timeout_s, poll_s=self.poll_s, reach=self.reach,
                           on_state=self.on_state, interrupts=self.interrupts)  # fmt: skip
        try:
            for spec in self.plan.servers:
                self._launch(spec)
                watch.add(self.handles[spec.name])
            with http.client(timeout=5.0) as polling:
                wait.servers(polling, self.plan.servers)
                router, url = self.plan.router, self.plan.router.url + "/readiness"
                self._launch(router)
                watch.add(self.handles[router.name])
                ready = router_counts(self.reach.url(url), len(self.plan.rank0()))
                not_ready = f"router on {router.node.name} not ready at {url}"
                wait.until(polling, router, ready, not_ready)
                if self.plan.router_metrics_url is not None:  # read before and after the run
                    metrics = self.plan.router_metrics_url
                    known = router_metrics_known(self.reach.url(metrics))
                    wait.until(polling, router, known, f"router metrics not served at {metrics}")
        except BringUpError as exc:
            handles = list(self.handles.values())
            message = with_every_tail(self.executor, handles, self.log_dir, str(exc), exc.process)
            raise BringUpError(message, exc.process) from None
        self.ready_s = time.monotonic() - self.started_at
        self.on_state(self.plan.router, "ready", self.plan.endpoint)

    def _prune(self) -> None:
        """Earlier runs' folders on every node beyond ``keep_runs`` (executors with a remote
        work_dir only); a node that cannot prune is not a reason to stop."""
        prune = getattr(self.executor, "prune_runs", None)
        if prune is None or self.keep_runs is None:
            return
        nodes = {spec.node.name: spec.node for spec in self.plan.processes}
        for node in nodes.values():
            try:
                self.pruned += [f"{node.name}:{d}" for d in prune(node, self.keep_runs)]
            except Exception as exc:
                self.progress(f"could not prune old run folders on {node.name}: {exc}")

    def _launch(self, spec: ProcessSpec) -> None:
        handle = self.start_extra(spec)
        self.on_state(spec, "starting", f"pgid {handle.pgid}")

    def start_extra(self, spec: ProcessSpec, log_path: Path | None = None) -> Handle:
        """Start ``spec`` as one of the deployment's processes (the client on a node, after
        bring-up): teardown stops it, fetches its log and checks it is gone, and a Ctrl-C
        between its start and its handle still finds it (``launching``)."""
        self.launching = spec
        handle = self.executor.start(spec, log_path or self.log_dir / f"{spec.name}.log")
        self.handles[spec.name] = handle
        self.launching = None
        return handle

    # -- teardown --------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop everything at once (TERM to every process group, router first; KILL what is
        left after ``grace_s``), fetch logs, and return what is still alive.

        All groups are signalled together, so a teardown takes one grace period, not one per
        process. Ctrl-C or SIGTERM arriving meanwhile is held until every process is stopped
        (``held_signal``), because giving up half-way would orphan the rest."""
        with hold_signals(self._hold):
            begin = getattr(self.executor, "begin_teardown", None)
            if begin is not None:  # SSH: a node lost during the run gets the longest patience
                begin()
            unverifiable = self._adopt_interrupted_launch()
            order = [h for h in self.handles.values() if h.spec.role == "router"]
            order += [h for h in self.handles.values() if h.spec.role != "router"]
            self.log_marks.update(teardown.log_sizes(self.executor, order))
            unreachable: dict[str, str] = {}  # process name -> why its node cannot be asked
            remaining = stop_all(
                order,
                self.executor.signal,  # one that raises (an unreachable node) is skipped
                lambda handle: teardown.alive(self.executor, handle, unreachable),
                grace_s=self.grace_s,
                poll_s=min(self.poll_s, 0.05),
                on_kill=lambda handle: self.killed.append(handle.spec.name),
            )
            teardown.fetch_logs(
                self.executor, order, self.log_dir, self.log_max_bytes, self.log_marks
            )
            self.leftovers = unverifiable + teardown.leftovers(order, remaining, unreachable)
            self.leftovers += teardown.cleanup(self.executor, order)
            self.leftovers += self.reach.close()  # SSH forwards (network.client), then SSH
            if getattr(self.reach, "closed", None):
                self.progress(f"{len(self.reach.closed)} SSH forward(s) closed")
            self.executor.close()
        return self.leftovers

    def _hold(self, signum: int) -> None:
        self.held_signal = signum
        self.progress(
            f"{signal.Signals(signum).name} received during teardown: stopping every process "
            "first (interrupting now would leave them running; SIGKILL pytest to abandon)"
        )

    def _adopt_interrupted_launch(self) -> list[str]:
        """A process whose start a Ctrl-C interrupted (``launching``), found again
        (:func:`~pytest_kimi.deploy.teardown.adopt`); what cannot be found is named."""
        spec, self.launching = self.launching, None
        if spec is None or spec.name in self.handles:
            return []
        return teardown.adopt(self.executor, spec, self.log_dir, self.handles)

    def __enter__(self) -> Deployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop()
        if exc_type is None and self.held_signal is not None:
            raise interrupt(self.held_signal)
