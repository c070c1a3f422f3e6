"""A request's part in the shared cluster clock: its holds, and its turn to go out in order.

On wall time holding is a no-op (:mod:`pytest_kimi.workload.clocks`). On a local mock run the
cluster clock stands still while a message is on its way, so the client holds it for a
request it is about to send and lets go of the engine's holds on the first and last token
once it has read them (:class:`Holds`); requests that may go out at the same instant go one
after another (:class:`Turn`, ``RunClock.in_order``). A module of its own so that the stream
reader (:mod:`pytest_kimi.workload.stream`) can let go of a hold as well as the request
(:mod:`pytest_kimi.workload.send`) and the run (:mod:`pytest_kimi.workload.client`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pytest_kimi.workload.clocks import RunClock
from pytest_kimi.workload.slots import Slots


class Holds:
    """The client's part in a shared clock for one request (no-ops on wall time).

    Before a request is sent the clock is held for it (by the client's ``Slots`` or the
    warm-up); an engine lets go when the request arrives. The engine holds the clock for the
    first and the last token; the client lets go of the first once it has read it, and of the
    last in :meth:`settle`, which the caller runs after the next request has taken its hold:
    no cluster time passes between a freed slot and the request it sends."""

    def __init__(self, clock: RunClock) -> None:
        self.clock, self.ended = clock, False

    def first_token(self) -> None:
        self.clock.release()

    def done(self) -> None:
        """The stream's end was read: the last token's hold is let go in :meth:`settle`."""
        self.ended = True

    def not_taken(self) -> None:
        """The request never reached an engine (an HTTP error, no connection)."""
        self.clock.release()

    def settle(self) -> None:
        if self.ended:
            self.ended = False
            self.clock.release()


class Burst:
    """The clock held while a run lets go of the requests (or sessions) of one instant.

    Each request holds the clock from its slot until an engine takes it in, but the run
    starts them one task at a time. On a busy machine the client can be switched out
    between two of them for milliseconds, long enough for the first request to reach its
    engine and let go of the only hold: the clock ran (a millisecond is 0.2 cluster seconds
    at 1:200) and the burst went out spread over cluster time. So the run holds the clock
    itself until every request of that instant has asked for a slot (and so holds the clock,
    or waits for a slot handed over with a hold). A run's later instants are kept by the
    clock's bound at each (``RunClock.sleep_until``); sessions' by the hold their pause ends
    with, which a ``Burst`` then keeps. On wall time nothing stands still: no-op."""

    def __init__(self, clock: RunClock, slots: Slots, *, held: bool = False) -> None:
        """``held``: the clock is held for this instant already (a pause's end holds it)."""
        self.clock, self.slots, self.held = clock, slots, clock.in_order
        if self.held and not held:
            clock.hold()

    async def end(self, requests: int) -> None:
        """Once ``requests`` requests have asked for a slot, let go (later calls do nothing)."""
        if self.held:
            await self.slots.asked(requests)
        self.let_go()

    def let_go(self) -> None:
        """Let go now (a run stopped partway)."""
        if self.held:
            self.held = False
            self.clock.release()


TAKEN_POLL_S = 0.0005  # wall seconds between looks at the shared clock's count of arrivals


class Turn:
    """A request's turn under an optional lock, given back exactly once."""

    def __init__(self, lock: asyncio.Lock | None) -> None:
        self.lock, self.held = lock, False

    async def take(self) -> None:
        if self.lock is not None:
            await self.lock.acquire()
            self.held = True

    def give(self) -> None:
        if self.held and self.lock is not None:
            self.held = False
            self.lock.release()


async def give_when_taken(turn: Turn, taken: Callable[[], int], before: int) -> None:
    """Give the turn back once an engine has taken a request in (ours: the only one out)."""
    while taken() <= before:
        await asyncio.sleep(TAKEN_POLL_S)
    turn.give()
