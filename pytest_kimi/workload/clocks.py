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

    def clear_bound(self) -> None:
        """No more sends are scheduled: nothing of this client's stops the clock."""
        ...


class WallClock:
    """Time as this machine measures it; nothing to hold."""

    in_order = False

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
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    def clear_bound(self) -> None:
        """Wall time has no bounds."""


WALL = WallClock()
