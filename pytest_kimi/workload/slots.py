"""Who may send when: concurrency slots, and pauses that end at an instant of the run's clock.

Both take the shared clock's hold for the request that follows them (no-ops on wall time), so
on the mock no cluster time passes between a freed slot, or a pause's end, and the request
it lets go (:mod:`pytest_kimi.workload.holds`).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools

from pytest_kimi.workload.clocks import RunClock


class Slots:
    """``concurrency`` slots; a freed slot goes straight to the oldest waiting request.

    Each request holds the clock from the moment it may be sent (a free slot, or one handed
    over) until an engine takes it in, so a closed loop's follow-up arrives at the cluster
    time its predecessor ended, as with a client that reacts at once."""

    def __init__(self, size: int, clock: RunClock) -> None:
        self.free, self.clock = size, clock
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self.entries = 0  # how many requests have asked for a slot
        self._entered = asyncio.Event()

    async def asked(self, n: int) -> None:
        """Until ``n`` requests have asked for a slot (:meth:`enter`)."""
        while self.entries < n:
            self._entered.clear()
            await self._entered.wait()

    async def enter(self) -> None:
        self.entries += 1  # before any await: a free slot's hold is taken in the same step
        self._entered.set()
        if self.free > 0 and not self.waiting:
            self.free -= 1
            self.clock.hold()
            return
        slot = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await slot  # the leaving request took the hold for us
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():  # handed over as it was stopped:
                self.clock.release()  # its hold and its slot go on to the next one
                self.leave()
            raise

    def leave(self) -> None:
        while self.waiting:
            slot = self.waiting.popleft()
            if not slot.done():
                self.clock.hold()
                slot.set_result(None)
                return
        self.free += 1


class Pauses:
    """Waits that end at instants of one clock (sessions' think times), any number at once.

    The mock's shared clock takes one bound per process: the client bounds it at the
    earliest pause's end, so no pause ends late in cluster time however many overlap, and
    each pause ends with the clock held for the request that follows it."""

    def __init__(self, clock: RunClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    def add(self, t: float) -> asyncio.Future[None]:
        """A pause until ``t``; the clock is bounded at once (await the future after)."""
        ends: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (t, next(self._order), ends))
        self.clock.bound_at(self._heap[0][0])
        self._changed.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return ends

    async def _run(self) -> None:
        while self._heap:
            t, _, ends = self._heap[0]
            if ends.cancelled():  # its session was stopped
                heapq.heappop(self._heap)
                continue
            self._changed.clear()
            sleep = asyncio.ensure_future(self.clock.sleep_until(t))
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                done, _ = await asyncio.wait({sleep, changed},
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            finally:  # also when the runner is stopped: neither outlives this turn
                sleep.cancel()
                changed.cancel()
            if sleep not in done:  # a new pause: it may end first
                continue
            _, _, ends = heapq.heappop(self._heap)  # due: the earliest is never after t
            if not ends.done():
                self.clock.hold()  # for the request this pause lets go
                ends.set_result(None)
        self.clock.clear_bound()

    async def close(self) -> None:
        """Stop waiting (the run ends or is cancelled); the clock's bound is let go."""
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        for _, _, ends in self._heap:
            ends.cancel()
        self._heap.clear()
        self.clock.clear_bound()
