"""Runs a :class:`ReplicaSim` in real time: cluster time -> wall time through the time scale.

Wall time = cluster time / ``time_scale`` (``time_scale`` 40 plays 40 cluster seconds in one
wall second; :mod:`pytest_kimi.mock.timebase`). Each event is scheduled against an absolute
wall deadline, so a late wake-up delays one event but never accumulates drift.

With a :class:`~pytest_kimi.workload.sharedclock.SharedClock` (a local run), cluster time is the
shared clock's. The engine bounds it at its next *telling* event, one that emits a request's first
or last token (:meth:`ReplicaSim.next_telling_time`): there the clock waits for the engine,
so a late wake-up costs wall time, never cluster time, where TTFT, E2E, TPOT and the next
arrival are decided. It holds the clock for each first and last token until the client has
read it, and lets go of the client's hold when a request arrives. What the client, the router
and HTTP spend in wall time stays out of cluster time (docs/mock.md, "One clock"). Tokens in
between are still written when the engine gets to them: a late wake-up there moves one
token's stamp (inter-token latency), never a per-request figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_kimi.mock.arrivals import Arrivals
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.simrequest import NO_IDS, SimRequest, TokenEvent, TokenIds
from pytest_kimi.mock.speculative import Drafts
from pytest_kimi.mock.timebase import TimeBase
from pytest_kimi.workload.sharedclock import INF, SharedClock


@dataclass
class Stream:
    """Tokens for one request, as the HTTP handler consumes them."""

    request: SimRequest
    queue: asyncio.Queue[TokenEvent]


PRECISE_S = 0.0015  # the last stretch before a deadline is slept precisely (blocking)
HELD_POLL_S = 0.0005  # while the shared clock is held, how often to look again (wall)
BOUND_POLL_S = 0.05  # while only an outside bound (Engine.bounds) stops the clock (wall)


class Engine:
    """Owns the simulation; HTTP handlers submit requests and read their token queues."""

    def __init__(
        self,
        sim: ReplicaSim,
        time_scale: float,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedClock | None = None,
    ) -> None:
        self.sim, self.time_scale, self.clock, self.shared = sim, time_scale, clock, shared
        self.timebase = TimeBase(time_scale, clock, shared)
        if shared is not None:
            shared.join()
        self.streams: dict[str, Stream] = {}
        self.arrivals = Arrivals()
        # the client never reads this engine's tokens (a prefill server's go to the router,
        # whose reading lets no hold go): hold the clock for none of them
        self.tokens_read = True
        # more bounds on the shared clock (disaggregation: a prompt waiting for its decode
        # server's first word), each a () -> cluster time or inf
        self.bounds: list[Callable[[], float]] = []
        self.on_finish: list[Callable[[str], None]] = []  # a request's last token came out
        self.wake = asyncio.Event()
        self.emitted_tokens = 0  # as generated: what the crash-after-tokens fault counts
        self.stalled = False  # a fault: the scheduler stops making progress
        self.lateness: list[float] = []  # wall seconds each event ran after its deadline

    def submit(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, drafts: Drafts | None = None,
        ids: TokenIds = NO_IDS,
    ) -> Stream:  # fmt: skip
        """Queue a request now; tokens arrive on the stream's queue (``ids``: its tokens).

        On a shared clock the request arrives where the clock stands: the engine bounds the
        clock there (it may not pass an arrival the model has not taken in yet) and lets go
        of the hold the client took before sending it."""
        if self.shared is not None:
            at = max(self.shared.arrive(), self.sim.now)
        else:
            at = max(self.timebase.now(), self.sim.now)
        return self.submit_at(rid, prompt_tokens, max_new_tokens, at, drafts=drafts, ids=ids)

    def submit_at(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, at: float, *,
        prebuilt: bool = False, drafts: Drafts | None = None, ids: TokenIds = NO_IDS,
    ) -> Stream:  # fmt: skip
        """Queue a request the model takes in at cluster time ``at`` (its arrival, or when a
        disaggregated request is ready on this side); tokens arrive on the stream's queue."""
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        at = max(at, self.sim.now)
        req = SimRequest(rid, prompt_tokens, max_new_tokens, at)  # placeholder until admitted
        stream = self.streams.get(rid) or Stream(req, queue)
        self.streams[rid] = stream
        self.arrivals.add(at, rid, prompt_tokens, max_new_tokens, prebuilt, drafts, ids)
        self.wake.set()
        return stream

    def expect(self, rid: str, prompt_tokens: int, max_new_tokens: int) -> Stream:
        """A stream for a request the model takes in later (:meth:`submit_at`), so that an
        abort in between finds it."""
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        req = SimRequest(rid, prompt_tokens, max_new_tokens, self.sim.now)
        stream = Stream(req, queue)
        self.streams[rid] = stream
        return stream

    def abort(self, rid: str, notify: bool = False) -> bool:
        """Forget a request's stream and free its slot in the model: its client went away, or
        (``notify``) ``/abort_request`` named it, and its stream then ends with an aborted
        event after the tokens already made. Whether the request was still known (running
        or waiting)."""
        stream = self.streams.pop(rid, None)
        self.arrivals.drop(rid)
        self.sim.abort(rid)
        if stream is not None and notify:
            made = stream.request.generated
            stream.queue.put_nowait(TokenEvent(rid, self.sim.now, 0, made, True, aborted=True))
        return stream is not None

    @property
    def running(self) -> int:
        return sum(1 for r in self.sim.running if r.finished_at is None)

    @property
    def queued(self) -> int:
        return len(self.sim.waiting) + self.arrivals.prompts()

    async def run(self) -> None:
        """The scheduler loop: sleep until the next event's wall deadline, then process it.

        asyncio wakes up to 1 ms late (epoll's timeout is in whole ms, rounded up), which at a
        time scale of 40 would be 40 ms of model time. So the loop waits on asyncio until about
        a millisecond before the deadline and sleeps the rest precisely, blocking the loop for
        under ``PRECISE_S``; arrivals that come meanwhile are stamped when it resumes."""
        if self.shared is not None:
            await self._run_shared(self.shared)
            return
        while True:
            nxt, event = self._next()
            if nxt is None or self.stalled:
                await self._idle()
                continue
            deadline = self.timebase.deadline(nxt)
            delay = deadline - self.clock()
            if delay > PRECISE_S:
                await self._wait(delay - PRECISE_S)
                continue
            if delay > 0:
                time.sleep(delay)
            if nxt == event:  # the model's own step, not a request's arrival
                self.lateness.append(max(0.0, self.clock() - deadline))
            self._process(nxt)
            await asyncio.sleep(0)  # let the streams write and new requests arrive

    async def _run_shared(self, shared: SharedClock) -> None:
        """The loop on a shared clock: bound it at the next telling event (or arrival), and
        process whatever the clock has reached, never past the bound.

        While the clock is held (a token on its way to the client, a request on its way to
        an engine) it stands still: the loop waits on asyncio, so this process keeps writing
        the streams whose reading lets the clock go."""
        try:
            while True:
                nxt, _ = self._next()
                if nxt is None or self.stalled:
                    extra = min([INF, *(bound() for bound in self.bounds)])
                    shared.bound(extra)
                    if extra < INF:  # a bound that may lapse on its own: look again soon
                        await self._wait(BOUND_POLL_S)
                    else:
                        await self._idle()
                    continue
                horizon = self._horizon()
                shared.bound(horizon)
                now = shared.cluster_now()
                if now < nxt:
                    delay = (nxt - now) / self.time_scale
                    if delay > PRECISE_S or shared.held():
                        await self._wait(max(delay - PRECISE_S, HELD_POLL_S))
                    else:
                        time.sleep(delay)
                        await asyncio.sleep(0)
                    continue
                self._process(min(now, horizon))
                await asyncio.sleep(0)  # let the streams write and new requests arrive
        finally:
            shared.leave()

    def _horizon(self) -> float:
        """How far the shared clock may run before this engine must have caught up: its next
        arrival or telling event."""
        telling = min([self.sim.next_telling_time(), *(bound() for bound in self.bounds)])
        first = self.arrivals.first()
        return telling if first is None else min(first, telling)

    def _next(self) -> tuple[float | None, float | None]:
        """The next thing to happen (cluster time), and the model's own next event."""
        event = self.sim.next_event_time()
        first = self.arrivals.first()
        if first is None:
            return event, event
        return (first if event is None else min(event, first)), event

    async def _idle(self) -> None:
        self.wake.clear()
        await self.wake.wait()

    async def _wait(self, timeout: float) -> None:
        """Until ``timeout`` wall seconds pass or something arrives."""
        self.wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    def _process(self, until: float) -> None:
        for a in self.arrivals.due(until):
            rid, prompt, new, at = a.rid, a.prompt, a.max_new, a.at
            self._dispatch(self.sim.advance(at))
            req = (self.sim.add_prebuilt(rid, prompt, new, at, a.drafts) if a.prebuilt
                   else self.sim.add(rid, prompt, new, at, a.drafts, a.ids))  # fmt: skip
            stream = self.streams.get(rid)
            if stream is not None:
                stream.request = req
        self._dispatch(self.sim.advance(until))

    def _dispatch(self, events: list[TokenEvent]) -> None:
        if self.shared is not None and self.tokens_read:  # before any stream sees them: the
            # reader lets go
            owed = sum((e.generated == 1) + e.finished for e in events if e.rid in self.streams)
            self.shared.hold_if_attached(owed)
        for event in events:
            self.emitted_tokens += event.count
            stream = self.streams.get(event.rid)
            if stream is not None:
                stream.queue.put_nowait(event)
                if event.finished:
                    del self.streams[event.rid]
            if event.finished:
                for hear in self.on_finish:
                    hear(event.rid)
