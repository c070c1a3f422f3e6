"""One generation request from arrival to ``[DONE]``: fault checks, the engine, the stream.

The API modules (native ``/generate``, the OpenAI routes) parse their bodies and say how a
request's progress looks on the wire (a ``render`` function); everything else is here: the
request's times (:class:`~pytest_kimi.mock.wire.meta.Times`), its outputs as SGLang's HTTP
side has them (every token of a stream; every 50 tokens and the last of a whole request),
what they count in ``/metrics`` (:class:`~pytest_kimi.mock.exported.ServerMetrics`), and
its end: all its tokens, an ``/abort_request`` (a last chunk with an abort finish reason),
or its client going away.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pytest_kimi.mock.decodeside import DecodeSide
from pytest_kimi.mock.disagg import Bootstrap, BootstrapError
from pytest_kimi.mock.engine import Engine, Stream
from pytest_kimi.mock.faults import LOG_LINES
from pytest_kimi.mock.http_common import (
    ARGS_KEY,
    ENGINE_KEY,
    FAULTS_KEY,
    GATE_KEY,
    METRICS_KEY,
    RECEIVED_KEY,
    SIDE_KEY,
    SSE_HEADERS,
    BadRequest,
    error_body,
    json_response,
    sse,
)
from pytest_kimi.mock.prefillside import PrefillSide
from pytest_kimi.mock.reqstate import State, Words, output_words
from pytest_kimi.mock.simrequest import NO_IDS, TokenIds
from pytest_kimi.mock.speculative import Drafts, acceptance, prompt_seed
from pytest_kimi.mock.tokenizer_files import count_tokens, token_ids
from pytest_kimi.mock.wire.meta import Progress, Times

log = logging.getLogger("sglang.mock")
FORCE_STREAM_INTERVAL = 50  # a whole request's outputs come every 50 tokens (SGLang's
# DEFAULT_FORCE_STREAM_INTERVAL, scheduler_output_processor_mixin.py)

# ``render(state)`` -> chunks to stream; ``render(state, whole=True)`` -> the non-streamed
# body; ``render(state, tail=True)`` -> chunks after the last token (a usage chunk).
Render = Callable[..., Any]


def prompt_tokens(value: Any) -> int:
    """A prompt's length in tokens: a list of token ids, or text through the mock tokenizer."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str):
        return count_tokens(value)
    raise BadRequest("expected a prompt string or a list of token ids")


def sampling(body: dict[str, Any], key: str, default: int) -> tuple[int, bool]:
    """``body[key]`` as a positive token count, and whether the request streams."""
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{key} must be a positive integer")
    return value, bool(body.get("stream", False))


def request_id(body: dict[str, Any]) -> str:
    """The body's ``rid`` (SGLang answers and aborts by it), else a fresh one like SGLang's."""
    rid = body.get("rid")
    return rid if isinstance(rid, str) and rid else uuid.uuid4().hex


def die(why: str) -> None:
    """A fault: the scheduler dies as SGLang's does, taking every stream with it."""
    log.error("mock fault: %s", why)
    log.error(LOG_LINES["engine_dead"])
    logging.shutdown()
    os._exit(1)


def _drafts(engine: Engine, source: Any) -> Drafts | None:
    """Under speculative decoding, the request's acceptance, from the prompt as sent."""
    if engine.sim.spec is None:
        return None
    prompt = source if isinstance(source, str | list) else ""
    return Drafts(acceptance(prompt), prompt_seed(prompt))


def _spec_meta(engine: Engine, stream: Stream) -> dict[str, Any]:
    """A finished request's ``spec_*`` keys (none without speculative decoding)."""
    spec, drafts = engine.sim.spec, stream.request.drafts
    if spec is None or drafts is None:
        return {}
    return drafts.meta(stream.request.generated, spec.max_drafts)


async def _submit(
    request: web.Request, rid: str, prompt: int, max_new: int, body: dict[str, Any],
    drafts: Drafts | None, ids: TokenIds = NO_IDS,
) -> tuple[Stream, int]:  # fmt: skip
    """To the engine, or through this server's disaggregation side: the stream, and how many
    tokens it will carry (a prefill server makes one)."""
    engine: Engine = request.app[ENGINE_KEY]
    side = request.app.get(SIDE_KEY)
    if side is None:
        return engine.submit(rid, prompt, max_new, drafts, ids), max_new
    try:
        boot = Bootstrap.of(body)
    except BootstrapError as exc:
        raise BadRequest(str(exc)) from None
    if isinstance(side, PrefillSide):
        return side.submit(rid, prompt, boot), 1
    assert isinstance(side, DecodeSide)
    return await side.submit(rid, prompt, max_new, boot, drafts), max_new


def _token_ids(engine: Engine, source: Any, words: Words) -> TokenIds:
    """The prompt's and the answer's token ids, when the replica keeps a prefix cache."""
    if engine.sim.cache is None:
        return NO_IDS
    if isinstance(source, list):
        prompt = tuple(int(t) for t in source)
    elif isinstance(source, str):
        prompt = token_ids(source)
    else:
        return NO_IDS
    return TokenIds(prompt, tuple(words.ids))


def _abort(request: web.Request, rid: str) -> bool:
    """Drop a request whose client went away; whether the engine still had it."""
    known = request.app[ENGINE_KEY].abort(rid)
    side = request.app.get(SIDE_KEY)
    if isinstance(side, PrefillSide | DecodeSide):
        side.forget(rid)
    return known


class Exchange:
    """One request's answer in the making: its times, its outputs as the HTTP side has them,
    and what they count (see the module docstring)."""

    def __init__(self, request: web.Request, rid: str, prompt: int, stream: bool,
                 handle: Stream) -> None:  # fmt: skip
        self.request, self.rid, self.prompt, self.stream = request, rid, prompt, stream
        self.handle, self.engine = handle, request.app[ENGINE_KEY]
        self.metrics, self.args = request.app[METRICS_KEY], request.app[ARGS_KEY]
        # sent to the scheduler: its arrival in the model, as a time of day
        self.dispatched = self.engine.timebase.wall_of(handle.request.arrival)
        self.received = min(float(request.get(RECEIVED_KEY, time.time())), self.dispatched)
        self.sent: float | None = None  # the first answer went out
        self.first_output: float | None = None
        self.last_output, self.last_tokens, self.events, self.outputs = 0.0, 0, 0, 0

    def times(self, finished: float | None = None) -> Times:
        """The request's times now; ``finished``: its last output's (a final answer's). Each
        model time is its time of day, no earlier than what came before it."""
        req, wall = self.handle.request, self.engine.timebase.wall_of
        admitted = first = None
        if req.admitted_at is not None:
            admitted = max(self.dispatched, wall(req.admitted_at))
            if req.token_times:
                first = max(admitted, wall(req.token_times[0]))
        if finished is not None:
            finished = max(finished, first or admitted or self.dispatched)
        # a decode throughput needs a first output before the last one (SGLang's
        # first_token_time is set by the first output the HTTP side gets)
        earlier = self.first_output if finished is None or self.outputs > 1 else None
        return Times(self.received, self.dispatched, admitted, first, finished, self.sent,
                     earlier)  # fmt: skip

    def state(self, words: Words, generated: int, before: int, finish: str | None,
              first_chunk: bool, now: float) -> State:  # fmt: skip
        spec = _spec_meta(self.engine, self.handle) if finish is not None else {}
        progress = Progress(self.rid, self.prompt, generated, finish, self.stream, first_chunk,
                            spec, self.handle.request.cached)  # fmt: skip
        replica = f"{self.args.host}:{self.args.port}" if self.args.mock_replica_header else None
        times = self.times(now if finish is not None else None)
        return State(progress, times, words, version=self.args.wire,
                     metrics=bool(self.args.enable_metrics), before=before,
                     replica=replica, cache_report=self.args.enable_cache_report)  # fmt: skip

    def event(self, generated: int, finished: bool, now: float) -> None:
        """A token event reached the HTTP side: the scheduler's queue and prefill times once,
        and an output (time to first token, or inter-token latency) where SGLang has one."""
        self.events += 1
        if self.events == 1:
            t = self.times()
            if t.admitted is not None and t.first_token is not None:
                self.metrics.admitted(t.admitted - t.dispatched, t.first_token - t.admitted)
        crossed = generated // FORCE_STREAM_INTERVAL > self.last_tokens // FORCE_STREAM_INTERVAL
        if not (self.stream or finished or crossed):
            return
        self.outputs += 1
        if self.first_output is None:
            self.first_output = now
            self.metrics.first_output(now - self.received, self.stream)
        elif generated > self.last_tokens:
            self.metrics.later_output(now - self.last_output, generated - self.last_tokens)
        self.last_output, self.last_tokens = now, generated

    @property
    def waiting(self) -> bool:
        """Not yet run by the scheduler: an abort now is answered by the tokenizer manager
        alone (``_handle_abort_req``), no output and nothing counted but the abort."""
        return self.handle.request.admitted_at is None

    def end(self, generated: int, now: float) -> None:
        """The request's last output: what a finished (or aborted) request counts."""
        if self.waiting:
            return
        first = self.times().first_token
        decode = now - first if first is not None else None
        self.metrics.finished(self.prompt, generated, self.stream, now - self.received, decode,
                              self.handle.request.cached)  # fmt: skip

    def abandon(self, generated: int) -> None:
        """Its client went away: abort it (counted as SGLang's ``abort_request`` counts it)
        and count its last output."""
        if _abort(self.request, self.rid):
            self.metrics.aborted()
            self.end(generated, time.time())


async def run_generation(
    request: web.Request, prompt: int, max_new: int, stream: bool, render: Render,
    body: dict[str, Any] | None = None, source: Any = None,
) -> web.StreamResponse:  # fmt: skip
    """Submit to the engine; stream (or collect) tokens, rendering each with ``render``.
    ``source``: the prompt as sent (text or token ids), for speculative decoding's
    acceptance."""
    engine, faults = request.app[ENGINE_KEY], request.app[FAULTS_KEY]
    faults.requests_seen += 1
    if faults.crash_after is not None and faults.requests_seen > faults.crash_after:
        die(f"crash at request {faults.requests_seen}")
    if faults.should_fail_request():
        raise web.HTTPInternalServerError(
            body=error_body("mock fault: internal error", 500, "500").encode(),
            content_type="application/json",
        )
    if faults.hold_until_late_health:  # test-only: wait until /health was seen late while busy
        await request.app[GATE_KEY].hold()
    rid = request_id(body or {})
    try:  # a client that goes away while a disaggregated side waits frees what it took
        drafts = _drafts(engine, source)
        words = output_words(rid, max_new)
        ids = _token_ids(engine, source, words)
        handle, max_new = await _submit(request, rid, prompt, max_new, body or {}, drafts, ids)
    except BaseException:
        _abort(request, rid)
        raise
    ex = Exchange(request, rid, prompt, stream, handle)
    if not stream:
        return await _whole(ex, words, render)
    return await _streamed(ex, words, render)


async def _whole(ex: Exchange, words: Words, render: Render) -> web.Response:
    generated, finish = 0, None
    try:
        while finish is None:
            event = await ex.handle.queue.get()
            generated = event.generated
            finish = "abort" if event.aborted else ("length" if event.finished else None)
            if not ex.waiting:
                ex.event(generated, finish is not None, time.time())
    except BaseException:
        ex.abandon(generated)
        raise
    now = time.time()
    ex.end(generated, now)
    ex.sent = now  # the whole answer goes out now
    return json_response(render(ex.state(words, generated, 0, finish, True, now), whole=True))


async def _streamed(ex: Exchange, words: Words, render: Render) -> web.StreamResponse:
    request, faults, engine = ex.request, ex.request.app[FAULTS_KEY], ex.engine
    headers = dict(SSE_HEADERS)
    if ex.args.mock_replica_header:
        headers["X-Kimi-Replica"] = f"{ex.args.host}:{ex.args.port}"
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    generated, finish = 0, None
    try:
        while finish is None:
            event = await ex.handle.queue.get()
            now = time.time()
            before, generated = generated, event.generated
            finish = "abort" if event.aborted else ("length" if event.finished else None)
            if not ex.waiting:
                ex.event(generated, finish is not None, now)
            first = ex.sent is None
            ex.sent = now if first else ex.sent
            for chunk in render(ex.state(words, generated, before, finish, first, now)):
                await response.write(sse(chunk))
            if faults.malformed_after_tokens is not None and (
                generated >= faults.malformed_after_tokens
            ):
                await response.write(b"data: {this is not json\n\n")
            if (
                faults.crash_after_tokens is not None
                and engine.emitted_tokens >= faults.crash_after_tokens
            ):
                die(f"crash after {engine.emitted_tokens} generated tokens")
            if faults.cut_after_tokens is not None and generated >= faults.cut_after_tokens:
                log.error("mock fault: cutting stream %s after %d tokens", ex.rid, generated)
                ex.abandon(generated)
                if request.transport is not None:
                    request.transport.close()
                return response
    except BaseException:
        ex.abandon(generated)
        raise
    now = time.time()
    ex.end(generated, now)
    for chunk in render(ex.state(words, generated, generated, finish, False, now), tail=True):
        await response.write(sse(chunk))
    await response.write(sse("[DONE]"))
    await response.write_eof()
    return response
