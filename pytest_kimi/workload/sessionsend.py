"""Sending sessions: each one's turns in order, at most ``concurrency`` sessions in flight.

Concurrency counts sessions, not requests: a session holds its slot from its first turn to
its last turn's end, think times included (docs/metrics.md, "Sessions"), as a user at a
keyboard or an agent in a loop does. Each turn sends the conversation so far with the
answers the server returned (:meth:`Session.messages`): on the chat API as messages, on the
others as text (``ClientOptions.render``: the model's chat template, or the plain
contents). A turn that fails ends its session: the next one would need its answer. With a
request rate, sessions start on a seeded Poisson schedule and each later turn is due at its
predecessor's end plus the think time; both are kept as ``intended_time``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence

import httpx

from pytest_kimi.results.records import RequestRecord
from pytest_kimi.workload.clocks import RunClock
from pytest_kimi.workload.holds import Burst, Holds
from pytest_kimi.workload.send import send_one
from pytest_kimi.workload.sessions import Session, words
from pytest_kimi.workload.slots import Pauses, Slots
from pytest_kimi.workload.specs import ClientOptions, arrival_gaps
from pytest_kimi.workload.stream import payload

Hooks = tuple[Callable[[RequestRecord], None], Callable[[RequestRecord], None]]


async def send_sessions(
    http: httpx.AsyncClient,
    url: str,
    sessions: Sequence[Session],
    options: ClientOptions,
    hooks: Hooks,
    records: list[RequestRecord],
    clock: RunClock,
) -> None:
    """Every session's turns; ``records`` gets each turn's record, in index order: session
    by session, turn by turn (a session that ended early leaves its later indexes unused)."""
    timed = bool(sessions) and all(s.start_s is not None for s in sessions)  # an arrival list
    run = _SessionRun(http, url, options, hooks, clock, timed)
    starts = _starts(sessions, options) if not timed else [
        (s.start_s or 0.0) - (sessions[0].start_s or 0.0) for s in sessions]  # fmt: skip
    first = list(itertools.accumulate((len(s.turns) for s in sessions), initial=0))
    tasks: list[asyncio.Task[list[RequestRecord]]] = []
    burst = Burst(clock, run.slots)  # each instant's sessions: at one cluster instant
    try:
        for i, session in enumerate(sessions):
            tasks.append(asyncio.create_task(run.session(session, first[i], starts[i])))
            await asyncio.sleep(0)  # it starts, and holds the clock if it may be sent now
            later = i + 1 < len(sessions) and starts[i + 1] > starts[i]
            if later and run.origin:  # the next session's start
                await burst.end(len(tasks))
                await run.pauses.add(run.origin[0] + starts[i + 1])
                burst = Burst(clock, run.slots, held=True)  # the pause's hold, for them
        await burst.end(len(tasks))
        for done in await asyncio.gather(*tasks):
            records.extend(done)
    finally:  # cancelled (an abort): no request may outlive the run or finish after it
        burst.let_go()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await run.pauses.close()


def _starts(sessions: Sequence[Session], options: ClientOptions) -> list[float]:
    """Each session's start after the first's: request_rate's seeded Poisson arrivals (all
    0 for inf: a closed loop)."""
    gaps = arrival_gaps(len(sessions), options.request_rate, options.seed)
    return list(itertools.accumulate(gaps, initial=0.0))[: len(sessions)]


class _SessionRun:
    """What every session of one run shares: the connection, its slots, its pauses."""

    def __init__(
        self, http: httpx.AsyncClient, url: str, options: ClientOptions, hooks: Hooks,
        clock: RunClock, timed: bool = False,
    ) -> None:  # fmt: skip
        """``timed``: the sessions start at their own instants (an arrival list), an open
        loop as request_rate's Poisson starts are."""
        self.http, self.url, self.options, self.hooks, self.clock = http, url, options, hooks, clock
        self.slots = Slots(options.concurrency, clock)
        self.pauses = Pauses(clock)
        self.origin: list[float] = []  # the schedule's origin: the first session's turn
        self.open_loop = timed or options.request_rate != float("inf")
        self.in_order = asyncio.Lock() if clock.in_order else None

    async def session(self, session: Session, first: int, start: float) -> list[RequestRecord]:
        """One session's turns, in order; their records."""
        await self.slots.enter()  # holds the clock for the first turn
        if not self.origin:
            self.origin.append(self.clock.now())
        due = self.origin[0] + start if self.open_loop else None
        rng = random.Random(f"{self.options.seed}:{session.id}")  # its own think times
        answers: list[str] = []
        done: list[RequestRecord] = []
        holds: Holds | None = None
        try:
            for k in range(len(session.turns)):
                record, body = self._prepare(session, k, first + k, answers)  # before its time
                if holds is not None:  # a later turn: its think time, then the clock held
                    due = await self._think(holds, done[-1], rng)
                record.intended_time = due
                holds = await self._send(record, body, answers)
                done.append(record)
                if not record.success:
                    break
            return done
        finally:
            self.slots.leave()  # the next session takes its hold first...
            if holds is not None:
                holds.settle()  # ...then this one's last token lets go

    async def _think(
        self, holds: Holds, last: RequestRecord, rng: random.Random
    ) -> float | None:
        """The pause before a session's next turn, from its last answer's end; the clock is
        held for that turn when it returns. The instant it was due, in an open loop."""
        pause = self.options.think_time.draw(rng)
        due = (last.end_time or self.clock.now()) + pause
        if pause > 0:
            ends = self.pauses.add(due)  # bounded before the last token lets go
            holds.settle()
            await ends
        else:
            self.clock.hold()  # no cluster time between the answer and the next turn
            holds.settle()
        return due if self.open_loop else None

    def _prepare(
        self, session: Session, k: int, index: int, answers: list[str]
    ) -> tuple[RequestRecord, dict]:
        """Turn ``k``'s record and body, with the conversation so far: built before its
        think time ends, so rendering a long conversation is not in its dispatch delay."""
        options = self.options
        messages = session.messages(k, answers)
        text = options.render(messages)
        chat = messages if options.api == "chat" else None
        body = payload(options.api, text, options.output_len, options.model, chat)
        record = RequestRecord(
            index=index, prompt_id=f"{session.id}/{k}", nominal_input_tokens=words(text),
            max_output_tokens=options.output_len, clock_start=options.clock_start,
            category=session.category, session_id=session.id, turn=k,
        )  # fmt: skip
        return record, body

    async def _send(self, record: RequestRecord, body: dict, answers: list[str]) -> Holds:
        """Send a prepared turn; its answer joins ``answers``."""
        options, (on_start, on_done) = self.options, self.hooks
        holds = Holds(self.clock)
        on_start(record)
        answer: list[str] = []
        await send_one(self.http, self.url, body, record, options.api, options.timeout_s,
                       self.clock.now, holds, self.in_order, self.clock.taken,
                       answer=answer)  # fmt: skip
        on_done(record)
        answers.extend(answer)
        return holds
