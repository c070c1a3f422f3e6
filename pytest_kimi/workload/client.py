"""Streaming benchmark client (httpx, asyncio) for SGLang's three APIs: the run's requests.

:func:`run_requests` sends a warm-up, then the workload at fixed concurrency (Poisson arrivals
when a request rate is set), each request by :func:`~pytest_kimi.workload.send.send_one`,
which measures what ``sglang.bench_serving`` measures and says where the clock starts. The
requests' bodies and the chunks they stream are :mod:`pytest_kimi.workload.stream`'s; their
part in the mock's shared clock is :mod:`pytest_kimi.workload.holds`'.

Connection policy: by default every request opens a new connection (``pooled=False``), as
bench_serving does with one aiohttp session per request. Streaming through the SGLang Router
over a reused keep-alive connection adds ~20-45 ms to TTFT (Nagle + delayed ACK on the
router side), while a new connection costs ~1-2 ms. ``pooled=True`` is there to measure that.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator, Sequence

import httpx

from pytest_kimi.results.records import RequestRecord
from pytest_kimi.workload import http, kernelstamps
from pytest_kimi.workload.abort import Abort
from pytest_kimi.workload.clocks import WALL, RunClock, WallClock
from pytest_kimi.workload.holds import Burst, Holds
from pytest_kimi.workload.send import send_one
from pytest_kimi.workload.sessions import Session
from pytest_kimi.workload.sessionsend import send_sessions
from pytest_kimi.workload.slots import Slots
from pytest_kimi.workload.specs import ClientOptions, RequestSpec, due_offsets
from pytest_kimi.workload.stream import API_PATHS, payload
from pytest_kimi.workload.transport import MeasuringTransport

PREPARE_AHEAD_S = 0.005
"""How early an open loop's request is prepared on a fresh connection: the client's work on
it (~0.3 ms of httpx) is done by its instant, which it waits for at its transport's last step."""


def _client(
    timeout_s: float, transport: MeasuringTransport | None
) -> httpx.AsyncClient:
    """Fresh connections through ``transport``, or (None) httpx's keep-alive pool."""
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    if transport is None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return http.async_client(limits=limits, timeout=timeout)
    return http.async_client(transport=transport, timeout=timeout)


async def run_requests(
    base_url: str,
    requests: Sequence[RequestSpec] | Sequence[Session],
    options: ClientOptions,
    *,
    warmup: Sequence[RequestSpec] = (),
    on_start: Callable[[RequestRecord], None] = lambda record: None,
    on_done: Callable[[RequestRecord], None] = lambda record: None,
    abort: Abort | None = None,
    clock: RunClock = WALL,
) -> list[RequestRecord]:
    """Send ``warmup`` one by one (kept, marked), then ``requests`` at fixed concurrency:
    single requests, or sessions of several turns (:mod:`pytest_kimi.workload.sessionsend`;
    concurrency then counts sessions in flight).

    ``on_start`` sees each record as its request is sent, ``on_done`` once it is filled in:
    a caller that is interrupted still holds every record, finished or in flight. ``abort``
    (another thread's :meth:`Abort.trip`) cancels every request in flight and raises
    :class:`RunAborted`. ``clock``: what stamps are read from, wall time unless the mock
    shares its cluster clock (:mod:`pytest_kimi.workload.clocks`).
    """
    url = base_url.rstrip("/") + API_PATHS[options.api]
    records: list[RequestRecord] = []
    hooks = (on_start, on_done)
    wall = isinstance(clock, WallClock)  # the kernel's stamps are on wall time only
    # stamping switched on before the first request, and kept on (kernelstamps.held_on)
    stamping = kernelstamps.held_on() if wall else contextlib.nullcontext(False)
    with _no_gc_pauses(), clock.attach(), stamping as stamped:
        if wall and stamped and not options.pooled:  # every arrival stamped by the kernel:
            clock = WallClock(kernel_wait=True)  # an open loop's waits may hold the loop
        # fresh connections go through MeasuringTransport, which waits for a prepared
        # request's instant at its last step (on a shared clock the schedule waits)
        ahead = PREPARE_AHEAD_S if wall and not options.pooled else 0.0
        transport = None if options.pooled else MeasuringTransport(clock=clock.now,
                                                                   kernel_stamps=wall)
        async with _client(options.timeout_s, transport) as http:
            if transport is not None:  # the name lookup before the schedule starts
                await transport.resolve(url)
            work = _send(http, url, requests, options, warmup, hooks, records, clock, ahead)
            await (work if abort is None else abort.guard(work))
    return records


def close_unfinished(records: Iterable[RequestRecord], reason: str, clock: RunClock = WALL) -> None:
    """Mark records whose request never completed (the run was interrupted) as failed with
    ``reason``; what had arrived (chunks, first token) is kept."""
    now = clock.now()  # the clock send_one stamps with
    for record in records:
        if record.end_time is None:
            record.end_time = now
        record.success = False
        record.error = reason


@contextlib.contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """No cyclic-GC pass during the run: in a big process (pytest) one takes 50-100 ms, and
    every stream that had a chunk waiting would record it that much late. Reference counting
    still frees almost everything; the cycles a run leaves wait for the automatic collector
    after it. No full collection is forced before or after: in a pytest process that has
    imported the reports' plotting, each took a third of a second of CPU, per run."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def _send_warmup(
    http: httpx.AsyncClient,
    url: str,
    warmup: Sequence[RequestSpec],
    options: ClientOptions,
    hooks: tuple[Callable[[RequestRecord], None], Callable[[RequestRecord], None]],
    records: list[RequestRecord],
    clock: RunClock,
) -> None:
    """The warm-up requests one by one, kept and marked."""
    on_start, on_done = hooks
    for i, spec in enumerate(warmup):
        record = _new_record(-1 - i, spec, options, warmup=True)
        body = payload(options.api, spec.text, spec.answer_tokens(options), options.model)
        on_start(record)
        clock.hold()  # let go by the engine that takes it in
        holds = Holds(clock)
        await send_one(http, url, body, record, options.api, options.timeout_s, clock.now, holds)
        holds.settle()
        records.append(record)
        on_done(record)


async def _send(
    http: httpx.AsyncClient,
    url: str,
    work: Sequence[RequestSpec] | Sequence[Session],
    options: ClientOptions,
    warmup: Sequence[RequestSpec],
    hooks: tuple[Callable[[RequestRecord], None], Callable[[RequestRecord], None]],
    records: list[RequestRecord],
    clock: RunClock,
    ahead: float,
) -> None:
    """Warmup one by one (kept, marked), then the measured requests or sessions."""
    await _send_warmup(http, url, warmup, options, hooks, records, clock)
    sessions = [w for w in work if isinstance(w, Session)]
    if sessions:
        if len(sessions) != len(work):
            raise TypeError("a run sends single requests or sessions, not both")
        await send_sessions(http, url, sessions, options, hooks, records, clock)
    else:
        requests = [w for w in work if isinstance(w, RequestSpec)]
        await _send_all(http, url, requests, options, hooks, records, clock, ahead)


async def _send_all(
    http: httpx.AsyncClient,
    url: str,
    requests: Sequence[RequestSpec],
    options: ClientOptions,
    hooks: tuple[Callable[[RequestRecord], None], Callable[[RequestRecord], None]],
    records: list[RequestRecord],
    clock: RunClock,
    ahead: float = 0.0,
) -> None:
    """The measured requests at fixed concurrency.

    ``ahead``: in an open loop each request is prepared that many seconds before its instant
    (record, body, httpx's request) and waits for it in the transport, just before connecting,
    so the client's work is not in its dispatch delay; 0: begun at it (shared clock, pool)."""
    on_start, on_done = hooks
    slots = Slots(options.concurrency, clock)
    offsets = due_offsets(requests, options)  # a trace's, the request rate's, or none
    open_loop = offsets is not None
    due_at = offsets or [0.0] * len(requests)
    origin: list[float] = []  # the schedule's origin: the first request's turn, or
    if ahead and open_loop:  # prepared ahead, the first one too: the run's start + ahead
        origin.append(clock.now() + ahead)
    in_order = asyncio.Lock() if clock.in_order else None

    async def one(index: int, spec: RequestSpec) -> RequestRecord:
        record = _new_record(index, spec, options)
        body = payload(options.api, spec.text, spec.answer_tokens(options), options.model)
        holds = Holds(clock)
        entered = False

        async def take_turn() -> None:
            """A concurrency slot, then, prepared ahead, the request's own instant."""
            nonlocal entered
            await slots.enter()
            entered = True
            if not origin:  # the first request may go: the schedule starts (a held clock stands)
                origin.append(clock.now())
            if open_loop:
                record.intended_time = origin[0] + due_at[index]
                if ahead:
                    await clock.sleep_until(record.intended_time)
            record.start_time = record.send_time = clock.now()
            on_start(record)  # sent now: in flight from here

        try:
            if not ahead or not open_loop:
                await take_turn()
            await send_one(http, url, body, record, options.api, options.timeout_s,
                           clock.now, holds, in_order, clock.taken,
                           at_turn=take_turn if ahead and open_loop else None)  # fmt: skip
            on_done(record)
            return record
        finally:
            if entered:
                slots.leave()  # the next request takes its hold first...
            holds.settle()  # ...then this one's last token lets go

    tasks: list[asyncio.Task[RequestRecord]] = []
    first = Burst(clock, slots)  # the first instant's requests: at one cluster instant
    try:
        for index, spec in enumerate(requests):
            tasks.append(asyncio.create_task(one(index, spec)))
            await asyncio.sleep(0)  # it starts, and holds the clock if it may be sent now
            later = index + 1 < len(requests) and due_at[index + 1] > due_at[index]
            if open_loop and later:  # the schedule's next instant, never the loop's wake-up
                await first.end(len(tasks))  # later instants: each one's bound keeps it
                due = origin[0] + due_at[index + 1]
                if ahead:  # the request waits for its instant itself, once prepared
                    await asyncio.sleep(max(0.0, due - ahead - clock.now()))
                else:
                    await clock.sleep_until(due)
        await first.end(len(tasks))
        clock.clear_bound()  # the schedule is done: the clock may pass the last send
        records.extend(await asyncio.gather(*tasks))
    finally:  # cancelled (an abort): no request may outlive the run or finish after it
        first.let_go()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _new_record(
    index: int, spec: RequestSpec, options: ClientOptions, warmup: bool = False
) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=spec.prompt_id,
        nominal_input_tokens=spec.nominal_tokens,
        max_output_tokens=spec.answer_tokens(options),
        warmup=warmup,
        clock_start=options.clock_start,
        category=spec.category,
    )
