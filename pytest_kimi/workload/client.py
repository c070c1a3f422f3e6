"""Streaming benchmark client (httpx, asyncio) for SGLang's three APIs.

It measures what ``sglang.bench_serving`` measures: the time the request goes out, the arrival
time of every chunk that carries generated text, and the end of the stream. Token counts come
from the server (``meta_info`` or ``usage``), never from a local tokenizer. Generated text
includes a reasoning model's ``delta.reasoning_content``, as ``sglang.benchmark.serving``
(0.5.15 on) counts it and bench_serving 0.5.9, which times only ``delta.content``, does not:
TTFT is the first token of any kind, and the first answer token is recorded next to it (see
:class:`_StreamParser`).

When the clock starts (``ClientOptions.clock_start``, ``workload.clock_start``): by default
where bench_serving starts it, "request": the instant the request is issued, before the
connection is opened, so TTFT and E2E hold connecting, sending and everything the server does.
"send" starts them when the request's first byte is written, once connected. Every record
keeps both instants, the connection's open and the request's last byte in the kernel
(``records.py``), whichever is chosen. What is the client's own work is done before the
clock starts: the body is serialised first (orjson), and a turn the shared mock clock makes a
request wait for is not counted.

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
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.workload.abort import Abort
from pytest_kimi.workload.clocks import WALL, RunClock, WallClock
from pytest_kimi.workload.transport import MeasuringTransport, Phases

loads = orjson.loads
JSON_HEADERS = {"Content-Type": "application/json"}
DRAIN_S = 1.0  # after [DONE], how long to wait for the body to end before letting it go

API_PATHS = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


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


def payload(api: str, text: str, output_len: int, model: str) -> dict[str, Any]:
    """Request body: temperature 0, fixed output length, ignore EOS (as bench_serving)."""
    if api == "generate":
        sampling = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
        return {"text": text, "sampling_params": sampling, "stream": True}
    common = {
        "model": model,
        "temperature": 0.0,
        "max_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        # usage in every chunk: SGLang merges tokens into one chunk at times (27 chunks for
        # 32 tokens seen on a CPU), and only a count per chunk says how many each carried
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if api == "completions":
        return {**common, "prompt": text}
    if api == "chat":
        return {**common, "messages": [{"role": "user", "content": text}]}
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_PATHS)}")


class _StreamParser:
    """Turns SSE data lines into (tokens in this chunk, whether it is answer) and final counts.

    Reasoning: SGLang's chat API with a reasoning parser streams the thinking as
    ``delta.reasoning_content`` before the answer's ``delta.content`` (0.5.9,
    ``serving_chat.py``); both are generated tokens, so both start the clock of TTFT. Its
    ``/v1/completions`` and ``/generate`` do not separate reasoning (0.5.9 has no reasoning
    field there: the thinking is part of ``text``), so everything they stream is answer.

    Token counts: ``/generate`` carries cumulative ``meta_info.completion_tokens`` in every
    chunk. OpenAI chunks carry ``usage`` in every chunk too, as the client asks for it
    (``continuous_usage_stats``, which SGLang 0.5.9 and 0.5.23 honour); from a server that
    ignores it each chunk with text counts as one token and the total comes from the final
    usage. A token the server counted but that decoded to no text (a special token: a
    random-weight model emits them) is not a chunk of its own: it arrives with the next chunk
    that carries text, or, after the last one, at the stream's last count (:meth:`unstreamed`).
    Reasoning tokens: ``usage.reasoning_tokens`` (or OpenAI's
    ``completion_tokens_details.reasoning_tokens``) when the server reports a positive number,
    else the tokens counted in reasoning chunks (SGLang 0.5.9's chat usage always says 0).
    """

    def __init__(self, api: str) -> None:
        self.api = api
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.request_id: str | None = None
        self.spec_verify_ct: int | None = None
        self.spec_accept_length: float | None = None
        self._seen = 0  # tokens carried by chunks with text so far
        self._per_chunk = False  # the server counted tokens in each chunk (not only at the end)
        self._last_reasoning = 0  # tokens the last chunk with text gave to reasoning
        self._reasoning_streamed = 0
        self._reasoning_reported = 0

    @property
    def reasoning_tokens(self) -> int:
        """The server's reasoning count where it gives one, else what streamed as reasoning."""
        return self._reasoning_reported or self._reasoning_streamed

    def feed(self, data: dict[str, Any]) -> tuple[int, bool]:
        """Tokens newly carried by this chunk (0 for chunks without generated text), and
        whether they are answer (False: reasoning)."""
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise _ServerError(str(message))
        if self.api == "generate":
            return self._feed_generate(data), True
        self.request_id = data.get("id", self.request_id)
        usage = data.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            self._reasoning_reported = _reported_reasoning(usage) or self._reasoning_reported
        choices = data.get("choices") or []
        if not choices:
            return 0, False
        choice = choices[0]
        if self.api == "completions":
            answer, reasoning = choice.get("text"), None
        else:
            delta = choice.get("delta") or {}
            answer, reasoning = delta.get("content"), delta.get("reasoning_content")
        if not answer and not reasoning:
            return 0, False
        tokens = 1
        if usage and usage.get("completion_tokens") is not None:  # continuous_usage_stats
            total = int(usage["completion_tokens"])
            tokens, self._seen, self._per_chunk = total - self._seen, total, True
        else:
            self._seen += 1
        if not answer:
            self._reasoning_streamed += tokens
            self._last_reasoning = tokens
        elif tokens == 0 and self._last_reasoning:
            # one step ended the thinking and began the answer: SGLang splits its text into a
            # reasoning chunk and a content chunk under one count, which the reasoning chunk
            # took whole; at least one of those tokens is answer (the split within the step is
            # not reported)
            self._reasoning_streamed -= 1
            self._last_reasoning = 0
        else:
            self._last_reasoning = 0
        return tokens, bool(answer)

    def _feed_generate(self, data: dict[str, Any]) -> int:
        meta = data.get("meta_info") or {}
        self.request_id = meta.get("id", self.request_id)
        self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
        if "spec_verify_ct" in meta:  # speculative decoding: the finished request's counts
            self.spec_verify_ct = int(meta["spec_verify_ct"])
            length = meta.get("spec_accept_length")
            self.spec_accept_length = None if length is None else float(length)
        total = meta.get("completion_tokens")
        if total is None:
            return 1 if data.get("text") else 0
        self.completion_tokens = int(total)
        self._per_chunk = True
        if not data.get("text"):  # counted, but no text yet: it comes with the next chunk
            return 0
        new, self._seen = self.completion_tokens - self._seen, self.completion_tokens
        return new

    def unstreamed(self) -> int:
        """Tokens the server counted after the last chunk with text (they decoded to no
        text), where it counted per chunk; 0 otherwise (a total from the final usage alone
        cannot say whether tokens were merged or unseen, nor where)."""
        if not self._per_chunk or self.completion_tokens is None:
            return 0
        return max(0, self.completion_tokens - self._seen)


def _reported_reasoning(usage: dict[str, Any]) -> int:
    """Reasoning tokens a usage object reports: SGLang's ``reasoning_tokens`` or OpenAI's
    ``completion_tokens_details.reasoning_tokens``; 0 when neither says."""
    details = usage.get("completion_tokens_details") or {}
    value = usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0
    return int(value)


class _ServerError(Exception):
    """An error object inside the stream."""


class Holds:
    """The client's part in a shared clock for one request (no-ops on wall time).

    Before a request is sent the clock is held for it (by :class:`_Slots` or the warm-up);
    an engine lets go when the request arrives. The engine holds the clock for the first and
    the last token; the client lets go of the first once it has read it, and of the last in
    :meth:`settle`, which the caller runs after the next request has taken its hold: no
    cluster time passes between a freed slot and the request it sends."""

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


TAKEN_POLL_S = 0.0005  # wall seconds between looks at the shared clock's count of arrivals


class _Turn:
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


async def _give_when_taken(turn: _Turn, taken: Callable[[], int], before: int) -> None:
    """Give the turn back once an engine has taken a request in (ours: the only one out)."""
    while taken() <= before:
        await asyncio.sleep(TAKEN_POLL_S)
    turn.give()


async def send_one(
    http: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    api: str,
    timeout_s: float,
    clock: Callable[[], float] = time.perf_counter,
    holds: Holds | None = None,
    in_order: asyncio.Lock | None = None,
    taken: Callable[[], int] | None = None,
) -> RequestRecord:
    """Send one streaming request and fill ``record``; failures are recorded, not raised.

    ``holds``: the shared clock's holds for this request (:class:`Holds`); none on wall time.
    ``in_order``: held from before the request goes out until its answer's head (or its
    failure) is back, so requests sent at one instant reach the server in order; or, with
    ``taken`` (the shared clock's count of requests engines took in), until that count
    grows: through a disaggregating router the head comes back only once the prefill server
    has answered, which takes cluster time that the requests still waiting hold still."""
    parser = _StreamParser(api)
    held = holds or Holds(WALL)
    content = orjson.dumps(body)  # our own work: done before the request's clock starts
    phases = Phases()
    record.start_time = record.send_time = clock()
    answered = False

    async def trace(event: str, info: dict) -> None:
        if event == "http11.send_request_headers.started":
            record.send_time = clock()

    turn = _Turn(in_order)
    watch: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(timeout_s):
            if in_order is not None:  # a turn is ours to wait for, not the request's time
                await turn.take()
                record.start_time = record.send_time = clock()
                if taken is not None:
                    watch = asyncio.create_task(_give_when_taken(turn, taken, taken()))
            extensions = {"trace": trace, "kimi_phases": phases}
            stream = http.stream("POST", url, content=content, headers=JSON_HEADERS,
                                 extensions=extensions)  # fmt: skip
            async with stream as response:
                record.connect_time, record.connected_time = phases.connecting, phases.connected
                record.sent_time = phases.sent
                turn.give()
                record.status = response.status_code
                answered = response.status_code == 200  # the server took the request in
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:500]
                    raise _ServerError(f"HTTP {response.status_code}: {text}")
                done_at = await _read_events(response, parser, record, clock, held)
                record.end_time = clock() if done_at is None else done_at
                if done_at is None:
                    raise _ServerError("stream ended without [DONE]")
        record.success = record.first_token_time is not None
        if not record.success:
            record.error = "stream carried no generated text"
    except TimeoutError:
        record.error = f"timeout: no complete response within {timeout_s:g}s"
    except _ServerError as exc:
        record.error = str(exc)
    except (json.JSONDecodeError, orjson.JSONDecodeError) as exc:
        record.error = f"malformed SSE data: {exc}"
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:  # also when the run is cancelled: no watcher outlives its request
        if watch is not None:
            watch.cancel()
    turn.give()
    if not answered:
        held.not_taken()
    if record.end_time is None:
        record.end_time = clock()
    record.prompt_tokens = parser.prompt_tokens
    record.completion_tokens = parser.completion_tokens
    record.request_id = parser.request_id
    record.reasoning_tokens = parser.reasoning_tokens
    record.spec_verify_ct = parser.spec_verify_ct
    record.spec_accept_length = parser.spec_accept_length
    return record


async def _read_events(
    response: httpx.Response,
    parser: _StreamParser,
    record: RequestRecord,
    clock: Callable[[], float],
    holds: Holds,
) -> float | None:
    """Consume SSE ``data:`` lines; return when ``[DONE]`` arrived (None: it never did).

    Works on raw byte reads and stamps every event in a read with the read's arrival time:
    events that arrived together were, for the client, received together. Bytes and orjson
    keep the per-event cost low, so the client keeps up with hundreds of streams.
    """
    pending = b""
    arrival = response.extensions.get("kimi_arrival")
    pieces = response.aiter_bytes().__aiter__()
    done_at: float | None = None
    counted_at = 0.0  # when the server's token count last grew
    while True:
        try:
            if done_at is None:
                data = await anext(pieces)
            else:  # drain the body's end, so a pooled connection can be reused
                data = await asyncio.wait_for(anext(pieces), DRAIN_S)
        except (StopAsyncIteration, TimeoutError):
            return done_at
        now = arrival.time if arrival is not None else clock()
        if done_at is not None:
            continue
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done_at = now
                holds.done()
                trailing = parser.unstreamed()
                if trailing and record.chunks:  # counted after the last text: they end here
                    record.chunks.append(Chunk(counted_at, trailing))
                break
            before = parser.completion_tokens
            tokens, answer = parser.feed(loads(payload))
            if parser.completion_tokens != before:
                counted_at = now
            if tokens > 0:
                if record.first_token_time is None:
                    record.first_token_time = now
                    holds.first_token()
                record.chunks.append(Chunk(now, tokens))
            # answer text, even in a chunk whose count the reasoning chunk before it took
            if answer and record.first_answer_time is None and record.first_token_time is not None:
                record.first_answer_time = now


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
    with _no_gc_pauses(), clock.attach():
        wall = isinstance(clock, WallClock)  # the kernel's stamps are on wall time only
        async with _client(options.pooled, options.timeout_s, clock.now,
                           kernel_stamps=wall) as http:  # fmt: skip
            work = _send_all(http, url, requests, options, warmup, hooks, records, clock)
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


async def _send_all(
    http: httpx.AsyncClient,
    url: str,
    requests: Sequence[RequestSpec],
    options: ClientOptions,
    warmup: Sequence[RequestSpec],
    hooks: tuple[Callable[[RequestRecord], None], Callable[[RequestRecord], None]],
    records: list[RequestRecord],
    clock: RunClock,
) -> None:
    """Warmup one by one (kept, marked), then the measured requests at fixed concurrency."""
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
    slots = _Slots(options.concurrency, clock)
    gaps = arrival_gaps(len(requests), options.request_rate, options.seed)
    in_order = asyncio.Lock() if clock.in_order else None

    async def one(index: int, spec: RequestSpec) -> RequestRecord:
        await slots.enter()
        holds = Holds(clock)
        try:
            record = _new_record(index, spec, options)
            body = payload(options.api, spec.text, options.output_len, options.model)
            on_start(record)
            await send_one(http, url, body, record, options.api, options.timeout_s,
                           clock.now, holds, in_order, clock.taken)  # fmt: skip
            on_done(record)
            return record
        finally:
            slots.leave()  # the next request takes its hold first...
            holds.settle()  # ...then this one's last token lets go

    tasks: list[asyncio.Task[RequestRecord]] = []
    try:
        due: float | None = None
        for index, spec in enumerate(requests):
            tasks.append(asyncio.create_task(one(index, spec)))
            await asyncio.sleep(0)  # it starts, and holds the clock if it may be sent now
            if due is None:
                due = clock.now()  # the schedule's origin: the first send
            if gaps[index] > 0:
                due += gaps[index]
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
