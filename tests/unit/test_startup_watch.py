"""The start-up watch: stalls are a live process's silent log, reports carry the last line, and
a failed bring-up shows every process's log tail. Time is driven, never waited for."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.deployment import Deployment
from pytest_kimi.deploy.executor import Handle
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.deploy.startup import StallError, StartupWatch
from pytest_kimi.deploy.waits import BringUpError

SMALL = Path(__file__).parents[1] / "integration" / "small_cluster.yaml"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeExecutor:
    """Logs in memory: ``logs[name]`` is the text; ``exits[name]`` an exit code."""

    poll_s = 0.0

    def __init__(self) -> None:
        self.logs: dict[str, str] = {}
        self.exits: dict[str, int] = {}

    def start(self, spec, log_path: Path) -> Handle:
        self.logs.setdefault(spec.name, f"{spec.name} starting\n")
        return Handle(spec, 1000 + len(self.logs), log_path)

    def log_size(self, handle: Handle) -> int | None:
        return len(self.logs[handle.spec.name])

    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        return "".join(self.logs[handle.spec.name].splitlines(keepends=True)[-lines:])

    def exit_code(self, handle: Handle) -> int | None:
        return self.exits.get(handle.spec.name)

    def port_in_use(self, node, port: int) -> bool:
        return False


@pytest.fixture
def plan():
    cluster = load_cluster(SMALL)
    return plan_deployment(cluster, cluster.layout("wide"))


def _watch(executor: FakeExecutor, plan, clock: Clock, reports: list) -> StartupWatch:
    watch = StartupWatch(
        executor,
        stall_s=100,
        report_s=30,
        clock=clock,
        sample_s=10,
        report=lambda handle, state, line: reports.append((handle.spec.name, state, line)),
    )
    for spec in plan.servers:
        watch.add(executor.start(spec, Path(f"{spec.name}.log")))
    return watch


def test_a_log_that_stops_growing_is_a_stall_naming_its_process(plan):
    executor, clock = FakeExecutor(), Clock()
    watch = _watch(executor, plan, clock, [])
    stuck = plan.servers[3].name
    for _ in range(30):  # 300 s: every log but one keeps growing
        clock.now += 10
        for spec in plan.servers:
            if spec.name != stuck:
                executor.logs[spec.name] += f"progress at {clock.now}\n"
        try:
            watch.check()
        except StallError as exc:
            assert exc.process == stuck and "stalled" in str(exc) and "node n4" in str(exc)
            assert 100 <= clock.now <= 120  # within stall_s + one sample of the last growth
            return
    pytest.fail("the silent log was never called stalled")


def test_growing_logs_and_healthy_quiet_ones_never_stall(plan):
    executor, clock = FakeExecutor(), Clock()
    watch = _watch(executor, plan, clock, [])
    quiet = plan.servers[1].name
    watch.healthy(quiet)  # its health answers: waiting for the others is normal
    for _ in range(100):  # 1000 s, ten times stall_s
        clock.now += 10
        for spec in plan.servers:
            if spec.name != quiet:
                executor.logs[spec.name] += "loading\n"
        watch.check()


def test_reports_at_the_interval_carry_state_and_last_line(plan):
    executor, clock = FakeExecutor(), Clock()
    reports: list = []
    watch = _watch(executor, plan, clock, reports)
    first = plan.servers[0].name
    watch.healthy(first)
    executor.logs[plan.servers[2].name] += "Load weight end. type=X\n\n"
    clock.now = 29
    watch.check()
    assert reports == []  # not yet due
    clock.now = 30
    watch.check()
    got = {name: (state, line) for name, state, line in reports}
    assert got[first][0] == "healthy" and len(got) == len(plan.servers)
    assert got[plan.servers[2].name] == ("starting", "Load weight end. type=X")


def test_a_failed_bring_up_shows_every_process_tail_and_writes_them(plan, tmp_path):
    executor = FakeExecutor()
    crashing = plan.servers[2]
    for spec in plan.servers:
        executor.logs[spec.name] = f"{spec.name} line 1\n{spec.name} line 2\n"
    executor.exits[crashing.name] = 1
    dep = Deployment(plan, executor, tmp_path / "logs", timeout_s=60, stall_s=100)
    with pytest.raises(BringUpError) as info:
        dep.start()
    message = str(info.value)
    assert info.value.process == crashing.name
    assert f"{crashing.name} (replica 1 node n3" in message and "exited with code 1" in message
    for spec in plan.servers:  # every other node's tail, not only the failing one's
        assert f"--- {spec.name} on {spec.node.name}" in message or spec is crashing
        assert f"{spec.name} line 2" in message
    written = (tmp_path / "startup-failure.txt").read_text()
    assert all(f"--- {spec.name} on {spec.node.name}" in written for spec in plan.servers)


def test_a_ctrl_c_swallowed_during_bring_up_stops_it_at_the_next_poll(plan, tmp_path):
    """A library that swallows the KeyboardInterrupt (a bare ``except:`` in a finalizer) does
    not make bring-up wait for its timeout: the next poll raises it again."""
    import contextlib
    import signal

    from pytest_kimi.deploy.procgroup import Interrupts

    class Swallowing(FakeExecutor):
        calls = 0

        def exit_code(self, handle: Handle) -> int | None:
            self.calls += 1
            if self.calls == 3:  # mid-round, inside "a library"
                with contextlib.suppress(BaseException):
                    signal.raise_signal(signal.SIGINT)
            return None

    executor, interrupts = Swallowing(), Interrupts()
    dep = Deployment(plan, executor, tmp_path / "logs", timeout_s=3600, stall_s=None,
                     interrupts=interrupts)  # fmt: skip
    with pytest.raises(KeyboardInterrupt, match=r"SIGINT .*swallowed"), interrupts.raised():
        dep.start()  # no server ever answers: only the interrupt can end this
    assert executor.calls <= 2 * len(plan.servers)  # acted on in the round after it landed


def test_a_ctrl_c_swallowed_before_bring_up_starts_nothing(plan, tmp_path):
    import signal

    from pytest_kimi.deploy.procgroup import Interrupts

    class Counting(FakeExecutor):
        started = 0

        def start(self, spec, log_path: Path) -> Handle:
            self.started += 1
            return super().start(spec, log_path)

    executor, interrupts = Counting(), Interrupts()
    interrupts.note(signal.SIGINT, None)  # landed, and was swallowed, in an earlier step
    dep = Deployment(plan, executor, tmp_path / "logs", timeout_s=3600, interrupts=interrupts)
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        dep.start()
    assert executor.started == 0
