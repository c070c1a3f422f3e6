"""One generation request from arrival to ``[DONE]``: fault checks, the engine, the stream.

The API modules (native ``/generate``, the OpenAI routes) parse their bodies and say how a
request's progress looks on the wire (a ``render`` function); everything else is here.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from aiohttp import web

from pytest_kimi.mock.disagg import Bootstrap, BootstrapError, DecodeSide, PrefillSide
from pytest_kimi.mock.engine import Engine, Stream
from pytest_kimi.mock.faults import LOG_LINES
from pytest_kimi.mock.http_common import (
    ARGS_KEY,
    ENGINE_KEY,
    FAULTS_KEY,
    GATE_KEY,
    SIDE_KEY,
    BadRequest,
    error_body,
    sse,
)
from pytest_kimi.mock.speculative import Drafts, acceptance, prompt_seed
from pytest_kimi.mock.tokenizer_files import count_tokens, vocabulary

log = logging.getLogger("sglang.mock")


class Words:
    """A request's whole output text, built once, with each token's start offset."""

    def __init__(self, words: list[str]) -> None:
        pieces = [" " + w for w in words]
        self.text = "".join(pieces)
        self.offsets = [0, *accumulate(len(p) for p in pieces)]


class State:
    """A request's progress, as renderers need it. ``replica`` is set only under
    ``--mock-replica-header``: SGLang's ``meta_info`` has no such key."""

    def __init__(
        self, rid: str, prompt: int, words: Words, generated: int, done: bool, started: float,
        replica: str | None = None, spec: dict[str, Any] | None = None, before: int | None = None,
    ) -> None:  # fmt: skip
        self.rid, self.prompt, self.words, self.replica = rid, prompt, words, replica
        self.generated, self.done, self.started = generated, done, started
        # tokens sent before this chunk: one fewer, or several under speculative decoding
        self.before = generated - 1 if before is None else before
        self.spec = spec or {}  # a finished request's speculative-decoding keys

    def text(self, start: int = 0) -> str:
        """Tokens ``start`` .. generated as text: a slice, not a rebuild (O(1) per chunk)."""
        return self.words.text[self.words.offsets[start] : self.words.offsets[self.generated]]

    def new_text(self) -> str:
        """The tokens this chunk adds (an OpenAI delta)."""
        return self.text(self.before)

    def span(self, start: int, end: int) -> str:
        """Tokens ``start`` .. ``end`` as text."""
        return self.words.text[self.words.offsets[start] : self.words.offsets[end]]

    def meta(self) -> dict[str, Any]:
        """SGLang 0.5.9's ``meta_info`` keys (tokenizer_manager.py): ``e2e_latency`` only once
        the request has finished, as there."""
        finish = {"type": "length", "length": self.generated} if self.done else None
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": finish,
            "prompt_tokens": self.prompt,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": self.generated,
            "cached_tokens": 0,
        }
        if self.done:
            meta["e2e_latency"] = time.monotonic() - self.started
            meta.update(self.spec)
        if self.replica is not None:
            meta["kimi_replica"] = self.replica
        return meta


# ``render(state)`` -> chunks to stream; ``render(state, whole=True)`` -> the non-streamed
# body; ``render(state, tail=True)`` -> chunks after the last token (a usage chunk).
Render = Callable[..., Any]


def output_words(rid: str, count: int) -> list[str]:
    """Deterministic output text: ``count`` vocabulary words chosen from the request id."""
    vocab = vocabulary()
    seed = sum(rid.encode()) if rid else 0
    return [vocab[(seed + 7 * i) % len(vocab)] for i in range(count)]


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
    drafts: Drafts | None,
) -> tuple[Stream, int]:  # fmt: skip
    """To the engine, or through this server's disaggregation side: the stream, and how many
    tokens it will carry (a prefill server makes one)."""
    engine: Engine = request.app[ENGINE_KEY]
    side = request.app.get(SIDE_KEY)
    if side is None:
        return engine.submit(rid, prompt, max_new, drafts), max_new
    try:
        boot = Bootstrap.of(body)
    except BootstrapError as exc:
        raise BadRequest(str(exc)) from None
    if isinstance(side, PrefillSide):
        return side.submit(rid, prompt, boot), 1
    assert isinstance(side, DecodeSide)
    return await side.submit(rid, prompt, max_new, boot, drafts), max_new


def _abort(request: web.Request, rid: str) -> None:
    request.app[ENGINE_KEY].abort(rid)
    side = request.app.get(SIDE_KEY)
    if isinstance(side, PrefillSide | DecodeSide):
        side.forget(rid)


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
            text=error_body("mock fault: internal error", 500, "500"),
            content_type="application/json",
        )
    if faults.hold_until_late_health:  # test-only: wait until /health was seen late while busy
        await request.app[GATE_KEY].hold()
    rid = uuid.uuid4().hex
    try:  # a client that goes away while a disaggregated side waits frees what it took
        drafts = _drafts(engine, source)
        handle, max_new = await _submit(request, rid, prompt, max_new, body or {}, drafts)
    except BaseException:
        _abort(request, rid)
        raise
    args = request.app[ARGS_KEY]
    replica = f"{args.host}:{args.port}" if args.mock_replica_header else None
    words = Words(output_words(rid, max_new))
    started = time.monotonic()
    response: web.StreamResponse | None = None
    if stream:
        headers = {"Content-Type": "text/event-stream"}
        if replica is not None:
            headers["X-Kimi-Replica"] = replica
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
    try:
        generated = 0
        while generated < max_new:
            event = await handle.queue.get()
            before, generated = generated, event.generated
            if response is not None:
                spec = _spec_meta(engine, handle) if event.finished else None
                state = State(rid, prompt, words, generated, event.finished, started, replica,
                              spec, before)  # fmt: skip
                for chunk in render(state):
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
                    log.error("mock fault: cutting stream %s after %d tokens", rid, generated)
                    _abort(request, rid)
                    if request.transport is not None:
                        request.transport.close()
                    return response
        final = State(rid, prompt, words, generated, True, started, replica,
                      _spec_meta(engine, handle))  # fmt: skip
    except BaseException:
        _abort(request, rid)
        raise
    if response is None:
        return web.json_response(render(final, whole=True))
    for chunk in render(final, tail=True):
        await response.write(sse(chunk))
    await response.write(sse("[DONE]"))
    await response.write_eof()
    return response
