"""One streaming request, sent and timed: :func:`send_one` fills a record, failures included.

It measures what ``sglang.bench_serving`` measures: the time the request goes out, the arrival
time of every chunk that carries generated text (:mod:`pytest_kimi.workload.stream`), and the
end of the stream.

When the clock starts (``ClientOptions.clock_start``, ``workload.clock_start``): by default
where bench_serving starts it, "request": the instant the request is issued, before the
connection is opened, so TTFT and E2E hold connecting, sending and everything the server does.
"send" starts them when the request's first byte is written, once connected. Every record
keeps both instants, the connection's open and the request's last byte in the kernel
(``records.py``), whichever is chosen. What is the client's own work is done before the
clock starts: the body is serialised first (orjson), and a turn the shared mock clock makes a
request wait for is not counted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson

from pytest_kimi.results.records import RequestRecord
from pytest_kimi.workload.clocks import WALL
from pytest_kimi.workload.holds import Holds, Turn, give_when_taken
from pytest_kimi.workload.stream import ServerError, StreamParser, read_events
from pytest_kimi.workload.transport import Phases

JSON_HEADERS = {"Content-Type": "application/json"}


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
    *,
    at_turn: Callable[[], Awaitable[None]] | None = None,
    answer: list[str] | None = None,
) -> RequestRecord:
    """Send one streaming request and fill ``record``; failures are recorded, not raised.

    ``holds``: the shared clock's holds for this request (:class:`Holds`); none on wall time.
    ``in_order``: held from before the request goes out until its answer's head (or its
    failure) is back, so requests sent at one instant reach the server in order; or, with
    ``taken`` (the shared clock's count of requests engines took in), until that count
    grows: through a disaggregating router the head comes back only once the prefill server
    has answered, which takes cluster time that the requests still waiting hold still.
    ``at_turn``: awaited just before connecting (``client._send_all``'s open-loop wait).
    ``answer``: the answer's text is appended to it (a session sends it back next turn)."""
    parser = StreamParser(api, keep_text=answer is not None)
    held = holds or Holds(WALL)
    content = orjson.dumps(body)  # our own work: done before the request's clock starts
    phases = Phases()
    record.start_time = record.send_time = clock()
    answered = False

    async def trace(event: str, info: dict) -> None:
        if event == "http11.send_request_headers.started":
            record.send_time = clock()

    turn = Turn(in_order)
    watch: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(timeout_s) as limit:
            if in_order is not None:  # a turn is ours to wait for, not the request's time
                await turn.take()
                record.start_time = record.send_time = clock()
                if taken is not None:
                    watch = asyncio.create_task(give_when_taken(turn, taken, taken()))
            extensions = {"trace": trace, "kimi_phases": phases,
                          "kimi_at_turn": _untimed(at_turn, limit, timeout_s)}  # fmt: skip
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
                    raise ServerError(f"HTTP {response.status_code}: {text}")
                done_at = await read_events(response, parser, record, clock, held)
                record.end_time = clock() if done_at is None else done_at
                if done_at is None:
                    raise ServerError("stream ended without [DONE]")
        record.success = record.first_token_time is not None
        if not record.success:
            record.error = "stream carried no generated text"
    except (TimeoutError, ServerError, json.JSONDecodeError, httpx.HTTPError) as exc:
        record.error = _error_text(exc, timeout_s)
    finally:  # also when the run is cancelled: no watcher outlives its request
        if watch is not None:
            watch.cancel()
    turn.give()
    if not answered:
        held.not_taken()
    if record.end_time is None:
        record.end_time = clock()
    _fill_counts(record, parser)
    if answer is not None:
        answer.append(parser.text)
    return record


def _untimed(
    at_turn: Callable[[], Awaitable[None]] | None, limit: asyncio.Timeout, timeout_s: float
) -> Callable[[], Awaitable[None]] | None:
    """The wait for a request's turn (its slot, its instant) kept out of its timeout, which
    then counts from the turn: as where a request is only begun at its turn."""
    if at_turn is None:
        return None

    async def wait() -> None:
        limit.reschedule(None)
        await at_turn()
        limit.reschedule(asyncio.get_running_loop().time() + timeout_s)

    return wait


def _error_text(exc: Exception, timeout_s: float) -> str:
    """What a failed request's record says of why."""
    if isinstance(exc, TimeoutError):
        return f"timeout: no complete response within {timeout_s:g}s"
    if isinstance(exc, ServerError):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):  # orjson's is a subclass
        return f"malformed SSE data: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _fill_counts(record: RequestRecord, parser: StreamParser) -> None:
    """What the server counted for the request (tokens, its id, speculative decoding)."""
    record.prompt_tokens = parser.prompt_tokens
    record.completion_tokens = parser.completion_tokens
    record.request_id = parser.request_id
    record.reasoning_tokens = parser.reasoning_tokens
    record.spec_verify_ct = parser.spec_verify_ct
    record.spec_accept_length = parser.spec_accept_length
    record.cached_tokens = parser.cached_tokens
