"""Bring a plan up, keep it healthy, and tear it down whatever happens.

Start-up order is an engineer's: every node's server, then (once each replica's rank 0
answers ``/health`` and ``/model_info``) the router, then wait for the router's
``/readiness`` to count every replica. Any process that exits while we wait fails the
bring-up at once, naming the node and showing the end of its log. ``stop`` signals every
process group, collects the logs and verifies nothing is left running.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from pytest_kimi.deploy.executor import Executor, Handle
from pytest_kimi.deploy.logs import Cut, fetch_all
from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
from pytest_kimi.deploy.procgroup import Interrupts, hold_signals, interrupt, stop_all
from pytest_kimi.deploy.reach import DIRECT, Reach
from pytest_kimi.deploy.readiness import (
    FormatError,
    Probe,
    answers_200,
    router_counts,
    router_metrics_known,
    wait_ready,
)
from pytest_kimi.deploy.startup import StallError, StartupWatch, all_tails

POLL_S = 0.1


class BringUpError(RuntimeError):
    """The deployment did not come up; the message says which node and why (``process``:
    the process it names, when one)."""

    def __init__(self, message: str, process: str | None = None) -> None:
        super().__init__(message)
        self.process = process


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
        self._watch: StartupWatch | None = None
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

    # -- bring-up ------------------------------------------------------------------------
    def start(self) -> None:
        """Start everything and wait until the router serves every replica. A failure names
        the process and shows its log's end, then every other process's last lines (all of
        them are written to ``startup-failure.txt`` beside the logs)."""
        self.interrupts.check()  # one swallowed before now: start nothing
        self.started_at = time.monotonic()
        deadline = self.started_at + self.timeout_s
        self.check_ports()
        self._prune()
        watch = StartupWatch(
            self.executor,
            stall_s=self.stall_s if self.stall_s is not None else float("inf"),
            report_s=self.report_s,
            report=lambda handle, state, line: self.on_log(handle.spec, state, line),
        )
        try:
            for spec in self.plan.servers:
                self._launch(spec)
                watch.add(self.handles[spec.name])
            self._watch = watch
            with httpx.Client(timeout=5.0, trust_env=False) as http:
                self._wait_servers(http, watch, deadline)
                router, url = self.plan.router, self.plan.router.url + "/readiness"
                self._launch(router)
                watch.add(self.handles[router.name])
                ready = router_counts(self.reach.url(url), len(self.plan.rank0()))
                where = f"router on {router.node.name} not ready at"
                self._wait(http, router, ready, f"{where} {url}", deadline)
                if self.plan.router_metrics_url is not None:  # read before and after the run
                    metrics = self.plan.router_metrics_url
                    known = router_metrics_known(self.reach.url(metrics))
                    what = f"router metrics not served at {metrics}"
                    self._wait(http, router, known, what, deadline)
        except BringUpError as exc:
            raise BringUpError(self._with_every_tail(str(exc), exc.process), exc.process) from None
        finally:
            self._watch = None
        self.ready_s = time.monotonic() - self.started_at
        self.on_state(self.plan.router, "ready", self.plan.endpoint)

    def _wait_servers(self, http: httpx.Client, watch: StartupWatch, deadline: float) -> None:
        """Until every server answers: rank 0 ``/health`` then ``/model_info`` (0.5.9 and 0.5.23
        serve it; ``/get_model_info`` is deprecated there and warns in the log at every call),
        every other rank its ``/health`` stub (SGLang serves one on ranks >= 1 once their
        schedulers are up). Each process is polled every round; exits and stalls fail at once."""
        pending: dict[str, list[tuple[str, Probe]]] = {}
        for spec in self.plan.servers:
            urls = [spec.url + "/health"]
            urls += [spec.url + "/model_info"] if spec.rank == 0 else []
            pending[spec.name] = [(url, answers_200(self.reach.url(url))) for url in urls]
        specs = {spec.name: spec for spec in self.plan.servers}
        why: dict[str, str] = {}
        while True:
            self._check_watch()
            for name in list(pending):
                probes = pending[name]
                while probes:
                    ok, why[name] = probes[0][1](http)
                    if not ok:
                        break
                    probes.pop(0)
                if not probes:
                    del pending[name]
                    watch.healthy(name)
                    self.on_state(specs[name], "healthy", specs[name].url)
            if not pending:
                return
            if time.monotonic() > deadline:
                name = next(iter(pending))
                spec, url = specs[name], pending[name][0][0]
                for other in pending:
                    self.on_state(specs[other], "failed", f"not healthy after {self.timeout_s:g}s")
                rank = f" rank {spec.rank}" if spec.rank else ""
                raise BringUpError(
                    f"replica {spec.replica}{rank} (node {spec.node.name}) not healthy at {url} "
                    f"after {self.timeout_s:g}s ({why.get(name, '')}); last lines of its log:\n"
                    + self.executor.log_tail(self.handles[name], 50),
                    name,
                )
            time.sleep(self.poll_s)

    def _check_watch(self) -> None:
        """Between polls: a swallowed Ctrl-C, exits, then stalls and the periodic report (once
        watching)."""
        self.interrupts.check()
        self.check_processes()
        if self._watch is None:
            return
        try:
            self._watch.check()
        except StallError as exc:
            handle = self.handles[exc.process]
            self.on_state(handle.spec, "failed", str(exc))
            raise BringUpError(
                f"{exc}; last lines of its log:\n{self.executor.log_tail(handle, 50)}",
                exc.process,
            ) from None

    def _with_every_tail(self, message: str, culprit: str | None) -> str:
        """``message`` plus every other process's last lines; all tails to a file."""
        handles = list(self.handles.values())
        path = self.log_dir.parent / "startup-failure.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{message}\n\n{all_tails(self.executor, handles, 50)}\n")
            where = f" (50 lines of each in {path})"
        except OSError:
            where = ""
        others = [h for h in handles if h.spec.name != culprit]
        if not others:
            return message
        return f"{message}\nlast lines of every other process{where}:\n" + all_tails(
            self.executor, others, 5
        )

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

    def check_ports(self) -> None:
        """Before starting anything: every port we will listen on must be free on its node."""
        wanted: list[tuple[ProcessSpec, int, str]] = []
        for spec in self.plan.processes:
            wanted.append((spec, spec.port, "HTTP"))
            if spec.rank == 0 and "--dist-init-addr" in spec.argv:
                addr = spec.argv[spec.argv.index("--dist-init-addr") + 1]
                wanted.append((spec, int(addr.rpartition(":")[2]), "--dist-init-addr"))
            if "--prometheus-port" in spec.argv:
                port = int(spec.argv[spec.argv.index("--prometheus-port") + 1])
                wanted.append((spec, port, "Prometheus"))
        for spec, port, role in wanted:
            if self.executor.port_in_use(spec.node, port):
                raise BringUpError(
                    f"port {port} ({role} of {spec.name}) is already in use on node "
                    f"{spec.node.name} ({spec.node.host}); stop what holds it or change the "
                    "port in the cluster file"
                )

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

    def check_processes(self) -> None:
        """Raise :class:`BringUpError` if any started process has exited."""
        for handle in self.handles.values():
            code = self.executor.exit_code(handle)
            if code is not None:
                spec = handle.spec
                where = f"replica {spec.replica} " if spec.replica is not None else ""
                tail = self.executor.log_tail(handle, 50)
                self.on_state(spec, "failed", f"exited with code {code}")
                raise BringUpError(
                    f"{spec.name} ({where}node {spec.node.name}, {spec.node.host}) exited with "
                    f"code {code} during start-up; last lines of its log:\n{tail}",
                    spec.name,
                )

    def _wait(
        self, http: httpx.Client, spec: ProcessSpec, probe: Probe, what: str, deadline: float
    ) -> None:
        """Until ``probe`` passes; a process exiting meanwhile fails at once, the deadline
        with ``what`` ("... not healthy at URL"), the probe's last reason and the log tail."""
        try:
            last = wait_ready(
                http, probe, deadline=deadline, poll_s=self.poll_s, between=self._check_watch
            )
        except FormatError as exc:  # waiting cannot fix it: fail now, naming the version
            from pytest_kimi.config.versions import ROUTER_PACKAGES
            from pytest_kimi.deploy.envinfo import router_version

            version = router_version(self.executor, spec) if spec.role == "router" else "?"
            supported = " or ".join(f"{p.name}{p.supported}" for p in ROUTER_PACKAGES.values())
            self.on_state(spec, "failed", f"answered in a format we do not understand: {exc}")
            raise BringUpError(
                f"{what}: {version} answered in a format we do not understand (we read "
                f"{supported}): {exc}",
                spec.name,
            ) from None
        if last is not None:
            self.on_state(spec, "failed", f"not ready after {self.timeout_s:g}s ({last})")
            raise BringUpError(
                f"{what} after {self.timeout_s:g}s ({last}); last lines of its log:\n"
                + self.executor.log_tail(self.handles[spec.name], 50),
                spec.name,
            )

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
            self._mark_logs(order)
            unreachable: dict[str, str] = {}  # process name -> why its node cannot be asked
            remaining = stop_all(
                order,
                self.executor.signal,  # one that raises (an unreachable node) is skipped
                lambda handle: self._alive(handle, unreachable),
                grace_s=self.grace_s,
                poll_s=min(self.poll_s, 0.05),
                on_kill=lambda handle: self.killed.append(handle.spec.name),
            )
            self._fetch_logs(order)
            self.leftovers = unverifiable + _leftovers(order, remaining, unreachable)
            self.leftovers += self._cleanup(order)
            self.leftovers += self.reach.close()  # SSH forwards (network.client), then SSH
            if getattr(self.reach, "closed", None):
                self.progress(f"{len(self.reach.closed)} SSH forward(s) closed")
            self.executor.close()
        return self.leftovers

    def _fetch_logs(self, handles: list[Handle]) -> None:
        """Every log, nodes in parallel, capped at ``log_max_bytes`` (head and tail kept); the
        teardown marks move to where the same bytes sit in the capped copies."""

        def fetch(handle: Handle) -> Cut | None:
            dest = self.log_dir / f"{handle.spec.name}.log"
            return self.executor.fetch_log(handle, dest, self.log_max_bytes)

        cuts = fetch_all(handles, fetch, lambda handle: handle.spec.node.name)
        for handle, cut in zip(handles, cuts, strict=True):
            name = f"{handle.spec.name}.log"
            if cut is not None and name in self.log_marks:
                self.log_marks[name] = cut.map(self.log_marks[name])

    def _cleanup(self, handles: list[Handle]) -> list[str]:
        """What the executor made besides processes (containers it started, environment files
        not yet read) goes last, once the logs are fetched; what it could not remove is a
        leftover. An executor without ``cleanup`` made nothing else."""
        cleanup = getattr(self.executor, "cleanup", None)
        if cleanup is None:
            return []
        try:
            return list(cleanup(handles))
        except Exception as exc:
            return [f"cleanup failed: unverifiable ({exc})"]

    def _hold(self, signum: int) -> None:
        self.held_signal = signum
        self.progress(
            f"{signal.Signals(signum).name} received during teardown: stopping every process "
            "first (interrupting now would leave them running; SIGKILL pytest to abandon)"
        )

    def _alive(self, handle: Handle, unreachable: dict[str, str]) -> bool:
        """A group whose node cannot be asked goes to ``unreachable`` (it cannot be proved
        gone) and counts as not alive, so it is not asked again."""
        try:
            return self.executor.alive(handle)
        except Exception as exc:
            unreachable[handle.spec.name] = str(exc)
            return False

    def _mark_logs(self, handles: list[Handle]) -> None:
        """Remember how long each log was before we stopped anything: stopping rank 0 makes
        the other ranks log NCCL errors, which are ours, not the run's (log checks stop here)."""
        for handle in handles:
            try:
                size = self.executor.log_size(handle)
            except Exception:  # an unreachable node: its whole log is checked
                size = None
            if size is not None:
                self.log_marks[f"{handle.spec.name}.log"] = size

    def _adopt_interrupted_launch(self) -> list[str]:
        """Ctrl-C can land after a process started but before its handle came back (on SSH
        that window is a round trip): find it from what the executor left on the node.
        Returns the process named as unverifiable if its node cannot be asked."""
        spec, self.launching = self.launching, None
        if spec is None or spec.name in self.handles:
            return []
        try:
            handle = self.executor.adopt(spec, self.log_dir / f"{spec.name}.log")
        except Exception as exc:
            return [f"{spec.name} on {spec.node.name}: unverifiable ({exc})"]
        if handle is None:  # cannot tell whether it started: say so rather than assume
            return [
                f"{spec.name} on {spec.node.name}: its start was interrupted and no process was "
                "found; check the node"
            ]
        self.handles[spec.name] = handle
        return []

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


def _leftovers(
    handles: list[Handle], alive: list[Handle], unreachable: dict[str, str]
) -> list[str]:
    """Name every process still running, or whose node could not tell us."""
    out = []
    for h in handles:
        where = f"{h.spec.name} on {h.spec.node.name}"
        if h.spec.name in unreachable:
            out.append(f"{where}: unverifiable ({unreachable[h.spec.name]})")
        elif h in alive:
            out.append(f"{where} (pgid {h.pgid})")
    return out
