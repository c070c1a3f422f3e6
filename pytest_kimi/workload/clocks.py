"""The clock a benchmark run reads: this machine's wall clock, or the mock's shared one.

On a real cluster (and whenever no shared clock is given) requests are timed on the monotonic
wall clock, and holding is a no-op. On a local mock run the mock's processes and the client
share one cluster clock (:class:`pytest_kimi.workload.sharedclock.SharedClock`) that stands still
while a message is on its way, so the client's, the router's and HTTP's wall time is not
multiplied into cluster time. The client's part in it is small: read it, hold it for a
request it is about to send, let go of the engine's hold on a request's first and last
token once it has read them (docs/mock.md, "One clock").
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Iterator
from typing import Protocol


class RunClock(Protocol):
    """What the client needs of a clock; :class:`WallClock` and ``SharedClock`` have it.

    ``in_order``: requests that may go out at the same instant are sent one after another
    in their order, each once the previous one is answered. On a held clock that costs no
    cluster time, and the router's round robin then sees a run's requests in the same order
    every time (on wall time it would cost real time: they go out at once)."""

    in_order: bool

    def now(self) -> float:
        """Seconds, for stamps: differences times the run's time scale are cluster time."""
        ...

    def hold(self, n: int = 1) -> None: ...

    def release(self, n: int = 1) -> None: ...

    def taken(self) -> int:
        """How many requests engines have taken in (a count that only grows)."""
        ...

    def attach(self) -> contextlib.AbstractContextManager[object]: ...

    async def sleep_until(self, t: float) -> None:
        """Until :meth:`now` reaches ``t`` (an open-loop arrival's send time); the clock may
        stay there until the next call or :meth:`clear_bound`."""
        ...

    def bound_at(self, t: float) -> None:
        """The clock may not pass ``t`` until the next bound or :meth:`clear_bound`: the
        earliest of several waits (sessions' think times) the client is about to sleep on."""
        ...

    def clear_bound(self) -> None:
        """No more sends are scheduled: nothing of this client's stops the clock."""
        ...


LOOP_SLACK_S = 0.0015
"""How early an open loop's wait hands over from the event loop's timer (late by up to 1 ms,
and by however long the loop was busy) to the kernel's."""


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class WallClock:
    """Time as this machine measures it; nothing to hold."""

    in_order = False

    def __init__(self, kernel_wait: bool = False) -> None:
        self.kernel_wait = kernel_wait
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []  # a heap, by instant
        self._order = itertools.count()

    def now(self) -> float:
        return time.perf_counter()

    def hold(self, n: int = 1) -> None:
        """Nothing stands still on a real cluster."""

    def release(self, n: int = 1) -> None:
        """Nothing to let go."""

    def taken(self) -> int:
        """Not known on a real cluster (and not needed: nothing is sent in order)."""
        return 0

    @contextlib.contextmanager
    def attach(self) -> Iterator[WallClock]:
        yield self

    async def sleep_until(self, t: float) -> None:
        """Until ``t``. asyncio waits in ``epoll_wait``, whose timeout is whole milliseconds
        rounded up, so its timers fire up to 1 ms late, and an open loop's every send would
        be. With ``kernel_wait`` the loop sleeps to within :data:`LOOP_SLACK_S` of ``t`` and
        the rest on the kernel's timer (tens of µs), holding the loop that long: only where
        no arrival is timed by its read (the kernel stamps every segment; the client says
        when, :func:`pytest_kimi.workload.client.run_requests`)."""
        delay = t - self.now()
        if not self.kernel_wait:
            if delay > 0:
                await asyncio.sleep(delay)
            return
        if delay > LOOP_SLACK_S:
            await self._near(t, delay - LOOP_SLACK_S)
        rest = t - self.now()
        if rest > 0:
            time.sleep(rest)
        self._wake_near()

    async def _near(self, t: float, delay: float) -> None:
        """Until ``delay`` seconds from now, or until a wait that ended near ``t`` wakes it."""
        loop = asyncio.get_running_loop()
        near: asyncio.Future[None] = loop.create_future()
        entry = (t, next(self._order), near)
        heapq.heappush(self._waiting, entry)
        timer = loop.call_later(delay, _done, near)
        try:
            await near
        finally:
            timer.cancel()
            if entry in self._waiting:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)

    def _wake_near(self) -> None:
        """Wake every wait whose instant is within :data:`LOOP_SLACK_S` of now. This wait
        held the loop until its instant; the next one's timer fired meanwhile, but would run
        only after the loop read everything that arrived during the hold. Woken from here it
        runs first, and waits out the rest on the kernel's timer."""
        horizon = self.now() + LOOP_SLACK_S
        while self._waiting and self._waiting[0][0] <= horizon:
            _done(heapq.heappop(self._waiting)[2])

    def bound_at(self, t: float) -> None:
        """Wall time has no bounds."""

    def clear_bound(self) -> None:
        """Wall time has no bounds."""


WALL = WallClock()
