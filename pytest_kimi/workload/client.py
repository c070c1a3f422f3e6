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
import collections
import contextlib
import gc
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import httpx

from pytest_kimi.results.records import RequestRecord
from pytest_kimi.workload import kernelstamps
from pytest_kimi.workload.abort import Abort
from pytest_kimi.workload.clocks import WALL, RunClock, WallClock
from pytest_kimi.workload.holds import Holds
from pytest_kimi.workload.send import send_one
from pytest_kimi.workload.stream import API_PATHS, payload
from pytest_kimi.workload.transport import MeasuringTransport

PREPARE_AHEAD_S = 0.005
"""How early an open loop's request is prepared on a fresh connection: the client's work on
it (~0.3 ms of httpx) is done by its instant, which it waits for at its transport's last step."""


@dataclass(frozen=True)
class ClientOptions:
    """How to send the workload."""

    api: str = "generate"
    output_len: int = 512
    concurrency: int = 8
    request_rate: float = float("inf")  # Poisson arrivals when finite
    timeout_s: float = 3600.0
    pooled: bool = False
    model: str = "default"
    seed: int = 0
    clock_start: str = "request"  # where TTFT and E2E start: "request" | "send" (records.py)


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt and its nominal length."""

    prompt_id: str
    text: str
    nominal_tokens: int
    category: str | None = None  # its SPEED-Bench category (the dataset row's)


def _client(
    pooled: bool, timeout_s: float, clock: Callable[[], float], *, kernel_stamps: bool = False
) -> httpx.AsyncClient:
    """Fresh connections through :class:`MeasuringTransport`, or httpx's keep-alive pool."""
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    if pooled:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
    transport = MeasuringTransport(clock=clock, kernel_stamps=kernel_stamps)
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)


async def run_requests(
    base_url: str,
    requests: Sequence[RequestSpec],
    options: ClientOptions,
    *,
    warmup: Sequence[RequestSpec] = (),
    on_start: Callable[[RequestRecord], None] = lambda record: None,
    on_done: Callable[[RequestRecord], None] = lambda record: None,
    abort: Abort | None = None,
    clock: RunClock = WALL,
) -> list[RequestRecord]:
    """Send ``warmup`` one by one (kept, marked), then ``requests`` at fixed concurrency.

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
        async with _client(options.pooled, options.timeout_s, clock.now,
                           kernel_stamps=wall) as http:  # fmt: skip
            work = _send_all(http, url, requests, options, warmup, hooks, records, clock, ahead)
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
    still frees almost everything; a full collection runs once the run is over."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


class _Slots:
    """``concurrency`` slots; a freed slot goes straight to the oldest waiting request.

    Each request holds the clock from the moment it may be sent (a free slot, or one handed
    over) until an engine takes it in, so a closed loop's follow-up arrives at the cluster
    time its predecessor ended, as with a client that reacts at once."""

    def __init__(self, size: int, clock: RunClock) -> None:
        self.free, self.clock = size, clock
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    async def enter(self) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            self.clock.hold()
            return
        slot = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        await slot  # the leaving request took the hold for us

    def leave(self) -> None:
        while self.waiting:
            slot = self.waiting.popleft()
            if not slot.done():
                self.clock.hold()
                slot.set_result(None)
                return
        self.free += 1


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
        body = payload(options.api, spec.text, options.output_len, options.model)
        on_start(record)
        clock.hold()  # let go by the engine that takes it in
        holds = Holds(clock)
        await send_one(http, url, body, record, options.api, options.timeout_s, clock.now, holds)
        holds.settle()
        records.append(record)
        on_done(record)


async def _send_all(
    http: httpx.AsyncClient,
    url: str,
    requests: Sequence[RequestSpec],
    options: ClientOptions,
    warmup: Sequence[RequestSpec],
    hooks: tuple[Callable[[RequestRecord], None], Callable[[RequestRecord], None]],
    records: list[RequestRecord],
    clock: RunClock,
    ahead: float = 0.0,
) -> None:
    """Warmup one by one (kept, marked), then the measured requests at fixed concurrency.

    ``ahead``: in an open loop each request is prepared that many seconds before its
    instant (record, body, httpx's request) and waits for it inside the transport, just
    before connecting, so the client's own work is not in its dispatch delay; 0: each is
    begun at its instant (the mock's shared clock, httpx's pool)."""
    on_start, on_done = hooks
    await _send_warmup(http, url, warmup, options, hooks, records, clock)
    slots = _Slots(options.concurrency, clock)
    gaps = arrival_gaps(len(requests), options.request_rate, options.seed)
    due_at = list(itertools.accumulate(gaps, initial=0.0))  # each request's offset
    open_loop = options.request_rate != float("inf")
    origin: list[float] = []  # the schedule's origin: the first request's turn, or
    if ahead and open_loop:  # prepared ahead, the first one too: the run's start + ahead
        origin.append(clock.now() + ahead)
    in_order = asyncio.Lock() if clock.in_order else None

    async def one(index: int, spec: RequestSpec) -> RequestRecord:
        record = _new_record(index, spec, options)
        body = payload(options.api, spec.text, options.output_len, options.model)
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

        try:
            if not ahead or not open_loop:
                await take_turn()
            on_start(record)
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
    try:
        for index, spec in enumerate(requests):
            tasks.append(asyncio.create_task(one(index, spec)))
            await asyncio.sleep(0)  # it starts, and holds the clock if it may be sent now
            if gaps[index] > 0:  # the schedule's next instant, never the loop's wake-up
                due = origin[0] + due_at[index + 1]
                if ahead:  # the request waits for its instant itself, once prepared
                    await asyncio.sleep(max(0.0, due - ahead - clock.now()))
                else:
                    await clock.sleep_until(due)
        clock.clear_bound()  # the schedule is done: the clock may pass the last send
        records.extend(await asyncio.gather(*tasks))
    finally:  # cancelled (an abort): no request may outlive the run or finish after it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait after sending request ``i``: a seeded Poisson process at ``rate``
    requests/s (exponential gaps, as bench_serving's ``--request-rate``); all zero for inf."""
    if rate == float("inf"):
        return [0.0] * n
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 or inf, got {rate}")
    rng = random.Random(seed)
    return [rng.expovariate(rate) if i + 1 < n else 0.0 for i in range(n)]


def _new_record(
    index: int, spec: RequestSpec, options: ClientOptions, warmup: bool = False
) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=spec.prompt_id,
        nominal_input_tokens=spec.nominal_tokens,
        max_output_tokens=options.output_len,
        warmup=warmup,
        clock_start=options.clock_start,
        category=spec.category,
    )
