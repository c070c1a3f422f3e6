"""The wall clock's wait for an open loop's next send: never early, the last stretch on the
kernel's timer rather than the event loop's (whole milliseconds, rounded up), and a wait that
ends wakes the next one due within the slack ahead of what the loop has read meanwhile."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from pytest_kimi.workload import clocks
from pytest_kimi.workload.clocks import LOOP_SLACK_S, WallClock


class Timed(WallClock):
    """A wall clock whose time moves only when it is waited on: what each wait asked for."""

    def __init__(self, kernel_wait: bool) -> None:
        super().__init__(kernel_wait)
        self.t = 100.0
        self.waits: list[tuple[str, float]] = []

    def now(self) -> float:
        return self.t

    async def _near(self, t: float, delay: float) -> None:
        self.waits.append(("loop", delay))
        self.t += delay


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch):
    def make(kernel_wait: bool) -> Timed:
        clock = Timed(kernel_wait)

        async def loop_sleep(seconds: float) -> None:
            clock.waits.append(("loop", seconds))
            clock.t += seconds

        def kernel_sleep(seconds: float) -> None:
            clock.waits.append(("kernel", seconds))
            clock.t += seconds

        monkeypatch.setattr(clocks.asyncio, "sleep", loop_sleep)
        monkeypatch.setattr(clocks.time, "sleep", kernel_sleep)
        return clock

    return make


def test_the_last_stretch_is_waited_on_the_kernels_timer(timed):
    clock = timed(kernel_wait=True)
    asyncio.run(clock.sleep_until(100.010))
    assert clock.waits == [("loop", pytest.approx(0.010 - LOOP_SLACK_S)),
                           ("kernel", pytest.approx(LOOP_SLACK_S))]  # fmt: skip
    clock.waits.clear()
    asyncio.run(clock.sleep_until(clock.t + LOOP_SLACK_S / 2))  # near: the kernel's alone
    assert clock.waits == [("kernel", pytest.approx(LOOP_SLACK_S / 2))]
    clock.waits.clear()
    asyncio.run(clock.sleep_until(clock.t - 1))  # already past: no wait at all
    assert clock.waits == []


def test_without_kernel_stamps_the_loop_is_never_held(timed):
    clock = timed(kernel_wait=False)
    asyncio.run(clock.sleep_until(100.010))
    assert clock.waits == [("loop", pytest.approx(0.010))]


@pytest.mark.parametrize("kernel_wait", [True, False])
def test_a_wait_never_ends_before_its_instant(kernel_wait: bool):
    clock = WallClock(kernel_wait)
    rng = random.Random(4)

    async def waits() -> list[tuple[float, float]]:
        out = []
        for _ in range(20):
            due = clock.now() + rng.uniform(0, 0.004)
            await clock.sleep_until(due)
            out.append((due, clock.now()))
        return out

    assert all(woke >= due for due, woke in asyncio.run(waits()))


def test_the_next_wait_due_within_the_slack_runs_before_what_arrived_meanwhile():
    """A holds the loop until its instant, then something arrives (A writes it itself, so
    no timing decides when). B is due 1.25 ms after A: it runs before the loop
    reads what arrived, woken by A's wait rather than by its own timer, which would queue
    it behind the read."""
    clock = WallClock(kernel_wait=True)
    order: list[str] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), lambda: order.append("read") or ours.recv(64))
        a_due = clock.now() + 0.050
        # within the slack of A's instant, but B's own timer (b_due - slack) comes after A's
        # (which fires up to 1 ms late: epoll's rounding), so the two are not run together
        b_due = a_due + LOOP_SLACK_S * 5 / 6

        async def a() -> None:
            await clock.sleep_until(a_due)
            order.append("a")
            theirs.send(b"x")  # arrives while A is still running
            await asyncio.sleep(0)

        async def b() -> None:
            await clock.sleep_until(b_due)
            order.append("b")
            assert clock.now() >= b_due

        try:
            await asyncio.gather(a(), b())
            while "read" not in order:
                await asyncio.sleep(0.001)
        finally:
            loop.remove_reader(ours.fileno())
            ours.close()
            theirs.close()

    asyncio.run(run())
    assert order[:3] == ["a", "b", "read"]
    assert clock._waiting == []  # no wait is left behind
