"""The checks and waits of a bring-up, and the error that fails it.

Before anything starts, every port the plan listens on must be free on its node. Then
:class:`StartupWait` waits for every server to answer and for the router to count every
replica; between polls, a swallowed Ctrl-C, a process that exits, one whose log stalls, or a
router that answers in a format we do not understand fails the bring-up at once, naming the
process and showing the end of its log (:class:`BringUpError`).
:class:`~pytest_kimi.deploy.deployment.Deployment` launches the processes and owns their
handles; this module only watches them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from pytest_kimi.deploy.executor import Executor, Handle
from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
from pytest_kimi.deploy.procgroup import Interrupts
from pytest_kimi.deploy.reach import Reach
from pytest_kimi.deploy.readiness import FormatError, Probe, answers_200, wait_ready
from pytest_kimi.deploy.startup import StallError, StartupWatch, all_tails

OnState = Callable[[ProcessSpec, str, str], None]  # (process, state, detail)


class BringUpError(RuntimeError):
    """The deployment did not come up; the message says which node and why (``process``:
    the process it names, when one)."""

    def __init__(self, message: str, process: str | None = None) -> None:
        super().__init__(message)
        self.process = process


def check_ports(executor: Executor, plan: DeploymentPlan) -> None:
    """Before starting anything: every port we will listen on must be free on its node."""
    wanted: list[tuple[ProcessSpec, int, str]] = []
    for spec in plan.processes:
        wanted.append((spec, spec.port, "HTTP"))
        if spec.rank == 0 and "--dist-init-addr" in spec.argv:
            addr = spec.argv[spec.argv.index("--dist-init-addr") + 1]
            wanted.append((spec, int(addr.rpartition(":")[2]), "--dist-init-addr"))
        if "--prometheus-port" in spec.argv:
            port = int(spec.argv[spec.argv.index("--prometheus-port") + 1])
            wanted.append((spec, port, "Prometheus"))
    for spec, port, role in wanted:
        if executor.port_in_use(spec.node, port):
            raise BringUpError(
                f"port {port} ({role} of {spec.name}) is already in use on node "
                f"{spec.node.name} ({spec.node.host}); stop what holds it or change the "
                "port in the cluster file"
            )


class StartupWait:
    """The waits of one start-up, against one deadline. ``handles`` is the deployment's own
    (it grows as processes are launched); ``on_state`` gets each process's bring-up state."""

    def __init__(
        self,
        executor: Executor,
        handles: dict[str, Handle],
        watch: StartupWatch,
        *,
        deadline: float,
        timeout_s: float,
        poll_s: float,
        reach: Reach,
        on_state: OnState,
        interrupts: Interrupts,
    ) -> None:
        self.executor, self.handles, self.watch = executor, handles, watch
        self.deadline, self.timeout_s, self.poll_s = deadline, timeout_s, poll_s
        self.reach, self.on_state, self.interrupts = reach, on_state, interrupts

    def servers(self, http: httpx.Client, servers: Sequence[ProcessSpec]) -> None:
        """Until every server answers: rank 0 ``/health`` then ``/model_info`` (0.5.9 and 0.5.23
        serve it; ``/get_model_info`` is deprecated there and warns in the log at every call),
        every other rank its ``/health`` stub (SGLang serves one on ranks >= 1 once their
        schedulers are up). Each process is polled every round; exits and stalls fail at once."""
        pending: dict[str, list[tuple[str, Probe]]] = {}
        for spec in servers:
            urls = [spec.url + "/health"]
            urls += [spec.url + "/model_info"] if spec.rank == 0 else []
            pending[spec.name] = [(url, answers_200(self.reach.url(url))) for url in urls]
        specs = {spec.name: spec for spec in servers}
        why: dict[str, str] = {}
        while True:
            self.between()
            for name in list(pending):
                probes = pending[name]
                while probes:
                    ok, why[name] = probes[0][1](http)
                    if not ok:
                        break
                    probes.pop(0)
                if not probes:
                    del pending[name]
                    self.watch.healthy(name)
                    self.on_state(specs[name], "healthy", specs[name].url)
            if not pending:
                return
            if time.monotonic() > self.deadline:
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

    def until(self, http: httpx.Client, spec: ProcessSpec, probe: Probe, what: str) -> None:
        """Until ``probe`` passes; a process exiting meanwhile fails at once, the deadline
        with ``what`` ("... not healthy at URL"), the probe's last reason and the log tail."""
        try:
            last = wait_ready(
                http, probe, deadline=self.deadline, poll_s=self.poll_s, between=self.between
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

    def between(self) -> None:
        """Between polls: a swallowed Ctrl-C, exits, then stalls and the periodic report."""
        self.interrupts.check()
        self.check_processes()
        try:
            self.watch.check()
        except StallError as exc:
            handle = self.handles[exc.process]
            self.on_state(handle.spec, "failed", str(exc))
            raise BringUpError(
                f"{exc}; last lines of its log:\n{self.executor.log_tail(handle, 50)}",
                exc.process,
            ) from None

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


def with_every_tail(
    executor: Executor, handles: list[Handle], log_dir: Path, message: str, culprit: str | None
) -> str:
    """``message`` plus every other process's last lines; all tails to a file
    (``startup-failure.txt`` beside the logs)."""
    path = log_dir.parent / "startup-failure.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{message}\n\n{all_tails(executor, handles, 50)}\n")
        where = f" (50 lines of each in {path})"
    except OSError:
        where = ""
    others = [h for h in handles if h.spec.name != culprit]
    if not others:
        return message
    return f"{message}\nlast lines of every other process{where}:\n" + all_tails(
        executor, others, 5
    )
