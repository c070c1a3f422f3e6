"""Reconnect with back-off (pytest_kimi.deploy.backoff, SSHExecutor's patience): a fake
connection factory and a fake clock, so no test waits for time to pass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.config.topology import SSHConfig
from pytest_kimi.deploy.backoff import Backoff, Patience, retrying
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.ssh import SSHExecutor
from pytest_kimi.deploy.sshconnections import NodeError, NodeUnreachable


class Clock:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Flaky(Exception):
    pass


def failing(times: int, result: str = "ok"):
    calls = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise Flaky(f"try {len(calls)}")
        return result

    return attempt, calls


def test_backoff_doubles_and_is_capped():
    delays = Backoff(first_s=0.5, factor=2, cap_s=4).delays()
    assert [next(delays) for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]


def test_retrying_succeeds_after_failures_with_growing_pauses():
    clock = Clock()
    attempt, calls = failing(3)
    out = retrying(attempt, patience_s=60, retry_on=lambda e: isinstance(e, Flaky),
                   clock=clock, sleep=clock.sleep)  # fmt: skip
    assert out == "ok" and len(calls) == 4
    assert clock.slept == [0.5, 1, 2]


def test_retrying_gives_up_when_patience_is_spent_with_a_last_try_at_the_deadline():
    clock = Clock()
    attempt, calls = failing(100)
    with pytest.raises(Flaky):
        retrying(attempt, patience_s=10, retry_on=lambda e: isinstance(e, Flaky),
                 clock=clock, sleep=clock.sleep)  # fmt: skip
    assert clock.slept == [0.5, 1, 2, 4, 2.5]  # the last pause ends at the deadline
    assert len(calls) == 6 and clock.now == 10


def test_retrying_does_not_retry_other_errors():
    clock = Clock()

    def attempt() -> str:
        raise ValueError("refused")

    with pytest.raises(ValueError):
        retrying(attempt, patience_s=60, retry_on=lambda e: isinstance(e, Flaky),
                 clock=clock, sleep=clock.sleep)  # fmt: skip
    assert clock.slept == []


def test_patience_marks_a_node_unreachable_then_one_quick_try_clears_it():
    clock = Clock()
    patience = Patience(Flaky, clock=clock, sleep=clock.sleep)
    attempt, calls = failing(100)
    with pytest.raises(Flaky):
        patience.call("n1", attempt, run_s=5, teardown_s=300)
    assert "n1" in patience.unreachable and clock.now == 5
    before = len(calls)
    with pytest.raises(Flaky):  # lost: one try, no pause
        patience.call("n1", attempt, run_s=5, teardown_s=300)
    assert len(calls) == before + 1 and clock.now == 5
    ok, _ = failing(0)
    assert patience.call("n1", ok, run_s=5, teardown_s=300) == "ok"
    assert "n1" not in patience.unreachable  # it came back


def test_teardown_retries_a_lost_node_with_the_longest_patience_once():
    clock = Clock()
    patience = Patience(Flaky, clock=clock, sleep=clock.sleep)
    attempt, calls = failing(100)
    with pytest.raises(Flaky):
        patience.call("n1", attempt, run_s=5, teardown_s=300)
    patience.begin_teardown()
    assert patience.unreachable == {}
    start = clock.now
    with pytest.raises(Flaky):
        patience.call("n1", attempt, run_s=5, teardown_s=300)
    assert clock.now - start == 300
    tries = len(calls)
    with pytest.raises(Flaky):  # spent: teardown's other questions fail at once
        patience.call("n1", attempt, run_s=5, teardown_s=300)
    assert len(calls) == tries


def test_teardown_patience_outlasts_a_blip():
    clock = Clock()
    patience = Patience(Flaky, clock=clock, sleep=clock.sleep)
    patience.begin_teardown()
    attempt, _ = failing(7)  # 0.5+1+2+4+8+8+8 = 31.5 s of outage
    assert patience.call("n1", attempt, run_s=5, teardown_s=300) == "ok"
    assert len(patience.retries) == 7 and patience.retries[0].startswith("n1: try 1")


# -- SSHExecutor with a fake connection factory ---------------------------------------------


class FakeResult:
    def __init__(self, out: str, code: int = 0, err: str = "") -> None:
        self.exited, self.stdout, self.stderr = code, out, err


class FakeConn:
    """A connection whose commands fail (EOFError: dropped) while ``net.down``."""

    def __init__(self, net: Net) -> None:
        self.net, self.is_connected, self.commands = net, True, []

    def run(self, command: str, **kwargs) -> FakeResult:
        if self.net.down_for_commands > 0:
            self.net.down_for_commands -= 1
            self.is_connected = False
            raise EOFError("connection dropped")
        self.commands.append(command)
        self.net.ran.append(command)
        answer = self.net.answer(command)
        return answer if isinstance(answer, FakeResult) else FakeResult(answer)

    def close(self) -> None:
        self.is_connected = False


@dataclasses.dataclass
class Net:
    connect_failures: int = 0  # the next connects that fail
    down_for_commands: int = 0  # the next commands that find the connection dropped
    opened: int = 0
    ran: list = dataclasses.field(default_factory=list)
    answers: dict = dataclasses.field(default_factory=dict)

    def answer(self, command: str) -> str:
        return next((v for k, v in self.answers.items() if k in command), "")


def executor(net: Net, clock: Clock) -> SSHExecutor:
    ex = SSHExecutor("/w", "run/tp", environ={})
    ex.connections.patience = Patience(NodeUnreachable, clock=clock, sleep=clock.sleep)

    def open_(node: Node) -> FakeConn:
        if net.connect_failures > 0:
            net.connect_failures -= 1
            raise NodeUnreachable(f"node {node.name} ({node.host}): unreachable: no route")
        net.opened += 1
        conn = FakeConn(net)
        ex.connections._conns[node.name] = conn
        return conn

    ex.connections._open = open_  # type: ignore[method-assign]
    return ex


NODE = Node("n1", "10.0.0.1", 8, SSHConfig(reconnect_s=20, teardown_reconnect_s=120))


def test_a_dropped_connection_is_reopened_and_a_safe_command_repeated():
    net, clock = Net(down_for_commands=1, connect_failures=0), Clock()
    ex = executor(net, clock)
    ex.connection(NODE)
    net.connect_failures = 3  # the blip: three connects fail after the drop
    net.answers = {"echo hi": "hi\n"}
    assert ex.run(NODE, "echo hi") == (0, "hi\n")
    assert net.opened == 2 and net.ran == ["echo hi"]
    assert clock.slept == [0.5, 1, 2, 4]


def test_a_login_scripts_stderr_is_not_part_of_a_successful_answer():
    # pyenv init in root's .bashrc, run by sshd for every command, racing itself on 8 nodes
    noise = "rm: cannot remove '/root/.pyenv/shims/tmp.JI6YrFOCv9': No such file or directory\n"
    net, clock = Net(), Clock()
    ex = executor(net, clock)
    net.answers = {"hostname": FakeResult("node603\n", 0, noise),
                   "false": FakeResult("", 1, noise + "it failed\n")}  # fmt: skip
    assert ex.run(NODE, "hostname") == (0, "node603\n")
    assert ex.run(NODE, "false") == (1, noise + "it failed\n")  # the error keeps everything


def test_a_node_down_longer_than_its_patience_is_lost_naming_it():
    net, clock = Net(connect_failures=1000), Clock()
    ex = executor(net, clock)
    with pytest.raises(NodeUnreachable, match=r"node n1 \(10.0.0.1\)"):
        ex.run(NODE, "true")
    assert clock.now == 20  # ssh.reconnect_s
    ex.begin_teardown()
    with pytest.raises(NodeUnreachable):
        ex.run(NODE, "true")
    assert clock.now == 20 + 120  # ssh.teardown_reconnect_s


def test_a_refused_connect_is_not_retried():
    net, clock = Net(), Clock()
    ex = executor(net, clock)

    def refuse(node: Node):
        raise NodeError("node n1 (10.0.0.1): SSH authentication refused")

    ex.connections._open = refuse  # type: ignore[method-assign]
    with pytest.raises(NodeError, match="refused"):
        ex.run(NODE, "true")
    assert clock.slept == []


def test_start_is_never_repeated_a_drop_under_it_adopts_the_pid_file():
    net, clock = Net(), Clock()
    ex = executor(net, clock)
    spec = ProcessSpec("replica0-node0-n1", NODE, ("python", "-m", "server"))
    ex.connection(NODE)
    net.answers = {"mkdir": "", "cat": "4242\n"}
    real_run = FakeConn.run
    starts = []

    def run(self, command, **kwargs):  # the start command's connection drops under it
        if "setsid" in command:
            starts.append(command)
            self.is_connected = False
            raise EOFError("connection dropped")
        return real_run(self, command, **kwargs)

    FakeConn.run = run  # type: ignore[method-assign]
    try:
        handle = ex.start(spec, Path("/tmp/x.log"))
    finally:
        FakeConn.run = real_run  # type: ignore[method-assign]
    assert len(starts) == 1  # not started a second time
    assert handle.pgid == 4242  # found from the pid file the node wrote
    assert any(".pid" in c for c in net.ran)
