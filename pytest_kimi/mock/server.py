"""SGLang's HTTP surface over the mock engine (aiohttp).

Endpoints and stream formats follow SGLang's: native ``/generate`` streams cumulative text
with ``meta_info``; the OpenAI routes stream deltas and, when asked, a final usage chunk.
``/kimi/ground_truth`` is the mock's own, test-only: every request's model-side timings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from itertools import accumulate
from typing import Any

import orjson
from aiohttp import web

from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.faults import LOG_LINES, FaultError, Faults
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR, count_tokens, vocabulary

VERSION = "0.5.9-kimi-mock"
ENGINE_KEY = web.AppKey("engine", Engine)
ARGS_KEY = web.AppKey("args", MockArgs)
FAULTS_KEY = web.AppKey("faults", Faults)
log = logging.getLogger("sglang.mock")


def build_app(args: MockArgs, engine: Engine, faults: Faults | None = None) -> web.Application:
    """The rank-0 application: every SGLang endpoint the product and its peers use."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY], app[ARGS_KEY] = engine, args
    app[FAULTS_KEY] = faults or Faults()
    r = app.router
    r.add_get("/health", _health)
    r.add_get("/health_generate", _health)
    r.add_get("/get_model_info", _model_info)
    r.add_get("/model_info", _model_info)
    r.add_get("/get_server_info", _server_info)
    r.add_get("/server_info", _server_info)
    r.add_get("/v1/models", _models)
    r.add_post("/generate", _generate)
    r.add_post("/v1/completions", _completions)
    r.add_post("/v1/chat/completions", _chat)
    r.add_route("*", "/flush_cache", _flush_cache)
    r.add_get("/get_load", _get_load)
    r.add_get("/metrics", _metrics)
    r.add_get("/kimi/ground_truth", _ground_truth)
    r.add_post("/kimi/faults", _set_faults)
    return app


def build_dummy_app() -> web.Application:
    """Ranks >= 1: SGLang serves a dummy health endpoint that always answers 200."""
    app = web.Application()
    app.router.add_get("/health", _dummy_health)
    app.router.add_get("/health_generate", _dummy_health)
    return app


async def _dummy_health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _health(request: web.Request) -> web.Response:
    faults = request.app[FAULTS_KEY]
    if faults.health == "fail":
        return web.Response(status=503, text="unhealthy (mock fault)\n")
    delay = faults.health_delay(busy=request.app[ENGINE_KEY].running > 0)
    if delay:
        await asyncio.sleep(delay)
    return web.Response(status=200)


def _die(why: str) -> None:
    """A fault: the scheduler dies as SGLang's does, taking every stream with it."""
    log.error("mock fault: %s", why)
    log.error(LOG_LINES["engine_dead"])
    logging.shutdown()
    os._exit(1)


async def _set_faults(request: web.Request) -> web.Response:
    """Test-only: change fault knobs at run time (JSON object of knob -> value)."""
    faults, engine = request.app[FAULTS_KEY], request.app[ENGINE_KEY]
    try:
        faults.update(await _body(request))
    except FaultError as exc:
        raise _BadRequest(str(exc)) from None
    engine.stalled = faults.stall
    engine.wake.set()
    state = {
        "crash_after": faults.crash_after,
        "stall": faults.stall,
        "cut_after_tokens": faults.cut_after_tokens,
        "malformed_after_tokens": faults.malformed_after_tokens,
        "error_rate": faults.error_rate,
        "health": faults.health,
        "requests_seen": faults.requests_seen,
    }
    return web.json_response(state)


async def _model_info(request: web.Request) -> web.Response:
    args = request.app[ARGS_KEY]
    return web.json_response(
        {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kimi_mock",
            "architectures": ["KimiMockForCausalLM"],
        }
    )


async def _server_info(request: web.Request) -> web.Response:
    args, engine = request.app[ARGS_KEY], request.app[ENGINE_KEY]
    info = args.server_info()
    info["version"] = VERSION
    info["internal_states"] = [
        {"last_gen_throughput": 0.0, "load": engine.running, "memory_usage": {}}
    ]
    info["kimi_mock"] = {"time_scale": engine.time_scale, "profile": args.profile}
    return web.json_response(info)


async def _models(request: web.Request) -> web.Response:
    args = request.app[ARGS_KEY]
    model = {
        "id": args.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": args.model_path,
        "max_model_len": args.context_length,
    }
    return web.json_response({"object": "list", "data": [model]})


async def _flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.\nPlease check backend logs for more details.\n")


async def _get_load(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    load = {"dp_rank": 0, "num_reqs": engine.running, "num_waiting_reqs": engine.queued}
    return web.json_response([load])


async def _metrics(request: web.Request) -> web.Response:
    args, engine = request.app[ARGS_KEY], request.app[ENGINE_KEY]
    if not args.enable_metrics:
        return web.Response(status=404, text="metrics are off; start with --enable-metrics\n")
    label = f'{{model_name="{args.served_model_name}"}}'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{label} {engine.running}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{label} {engine.queued}",
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{label} {engine.prompt_tokens_total}",
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total{label} {engine.emitted_tokens}",
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def _ground_truth(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    late = sorted(engine.lateness)
    body = {
        "time_scale": engine.time_scale,
        "requests": [r.ground_truth() for r in engine.sim.requests.values()],
        "steps": engine.sim.steps,
        "lateness_ms": {  # how late (wall) the scheduler ran each event: its own timing error
            "count": len(late),
            "mean": 1000 * sum(late) / len(late) if late else 0.0,
            "p99": 1000 * late[int(0.99 * (len(late) - 1))] if late else 0.0,
            "max": 1000 * late[-1] if late else 0.0,
        },
    }
    return web.json_response(body)


# -- generation ----------------------------------------------------------------------------


class _BadRequest(web.HTTPBadRequest):
    def __init__(self, message: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "BadRequestError"}})
        super().__init__(text=body, content_type="application/json")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise _BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    return body


def _words(rid: str, count: int) -> list[str]:
    """Deterministic output text: ``count`` vocabulary words chosen from the request id."""
    vocab = vocabulary()
    seed = sum(rid.encode()) if rid else 0
    return [vocab[(seed + 7 * i) % len(vocab)] for i in range(count)]


def _prompt_tokens(value: Any) -> int:
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str):
        return count_tokens(value)
    raise _BadRequest("expected a prompt string or a list of token ids")


def _sse(data: Any) -> bytes:
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


async def _run(
    request: web.Request, prompt_tokens: int, max_new: int, stream: bool, render: Any
) -> web.StreamResponse:
    """Submit to the engine; stream (or collect) tokens, rendering each with ``render``."""
    engine, faults = request.app[ENGINE_KEY], request.app[FAULTS_KEY]
    faults.requests_seen += 1
    if faults.crash_after is not None and faults.requests_seen > faults.crash_after:
        _die(f"crash at request {faults.requests_seen}")
    if faults.should_fail_request():
        raise web.HTTPInternalServerError(
            text=json.dumps({"error": {"message": "mock fault: internal error", "code": 500}}),
            content_type="application/json",
        )
    rid = uuid.uuid4().hex
    handle = engine.submit(rid, prompt_tokens, max_new)
    args = request.app[ARGS_KEY]
    replica = f"{args.host}:{args.port}"
    words = _Words(_words(rid, max_new))
    started = time.monotonic()
    response: web.StreamResponse | None = None
    if stream:
        headers = {"Content-Type": "text/event-stream", "X-Kimi-Replica": replica}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
    try:
        generated = 0
        while generated < max_new:
            event = await handle.queue.get()
            generated = event.generated
            if response is not None:
                state = _State(
                    rid, prompt_tokens, words, generated, event.finished, started, replica
                )
                for chunk in render(state):
                    await response.write(_sse(chunk))
                if faults.malformed_after_tokens is not None and (
                    generated >= faults.malformed_after_tokens
                ):
                    await response.write(b"data: {this is not json\n\n")
                if (
                    faults.crash_after_tokens is not None
                    and engine.emitted_tokens >= faults.crash_after_tokens
                ):
                    _die(f"crash after {engine.emitted_tokens} generated tokens")
                if faults.cut_after_tokens is not None and generated >= faults.cut_after_tokens:
                    log.error("mock fault: cutting stream %s after %d tokens", rid, generated)
                    engine.abort(rid)
                    if request.transport is not None:
                        request.transport.close()
                    return response
        final = _State(rid, prompt_tokens, words, generated, True, started, replica)
    except BaseException:
        engine.abort(rid)
        raise
    if response is None:
        return web.json_response(render(final, whole=True))
    for chunk in render(final, tail=True):
        await response.write(_sse(chunk))
    await response.write(_sse("[DONE]"))
    await response.write_eof()
    return response


class _Words:
    """A request's whole output text, built once, with each token's start offset."""

    def __init__(self, words: list[str]) -> None:
        pieces = [" " + w for w in words]
        self.text = "".join(pieces)
        self.offsets = [0, *accumulate(len(p) for p in pieces)]


class _State:
    """A request's progress, as renderers need it."""

    def __init__(
        self, rid: str, prompt: int, words: _Words, generated: int, done: bool, started: float,
        replica: str = "",
    ) -> None:  # fmt: skip
        self.rid, self.prompt, self.words, self.replica = rid, prompt, words, replica
        self.generated, self.done, self.started = generated, done, started

    def text(self, start: int = 0) -> str:
        """Tokens ``start`` .. generated as text: a slice, not a rebuild (O(1) per chunk)."""
        return self.words.text[self.words.offsets[start] : self.words.offsets[self.generated]]

    def meta(self) -> dict[str, Any]:
        finish = {"type": "length", "length": self.generated} if self.done else None
        return {
            "id": self.rid,
            "kimi_replica": self.replica,
            "finish_reason": finish,
            "prompt_tokens": self.prompt,
            "completion_tokens": self.generated,
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - self.started,
        }


def _sampling(body: dict[str, Any], key: str, default: int) -> tuple[int, bool]:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _BadRequest(f"{key} must be a positive integer")
    return value, bool(body.get("stream", False))


async def _generate(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _BadRequest("sampling_params must be an object")
    prompt = body["input_ids"] if "input_ids" in body else body.get("text")
    max_new, stream = _sampling(params, "max_new_tokens", 128)
    stream = bool(body.get("stream", False))

    def render(s: _State, whole: bool = False, tail: bool = False) -> Any:
        if whole:
            return {"text": s.text(), "meta_info": s.meta()}
        if tail:
            return []
        return [{"text": s.text(), "meta_info": s.meta()}]

    return await _run(request, _prompt_tokens(prompt), max_new, stream, render)


def _openai_head(body: dict[str, Any], kind: str, rid: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": body.get("model")}


def _usage(s: _State) -> dict[str, int]:
    return {
        "prompt_tokens": s.prompt,
        "completion_tokens": s.generated,
        "total_tokens": s.prompt + s.generated,
    }


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    max_new, stream = _sampling(body, "max_tokens", 16)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def render(s: _State, whole: bool = False, tail: bool = False) -> Any:
        head = _openai_head(body, "text_completion", s.rid)
        if whole:
            choice = {"index": 0, "text": s.text(), "logprobs": None, "finish_reason": "length"}
            return {**head, "choices": [choice], "usage": _usage(s)}
        if tail:
            return [{**head, "choices": [], "usage": _usage(s)}] if include_usage else []
        finish = "length" if s.done else None
        choice = {
            "index": 0,
            "text": s.text(s.generated - 1),
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": None,
        }
        return [{**head, "choices": [choice], "usage": None}]

    return await _run(request, _prompt_tokens(body.get("prompt")), max_new, stream, render)


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    max_new, stream = _sampling(body, "max_tokens", 16)
    if "max_completion_tokens" in body:
        max_new, _ = _sampling(body, "max_completion_tokens", max_new)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages must be a non-empty list")
    prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))

    def render(s: _State, whole: bool = False, tail: bool = False) -> Any:
        head = _openai_head(body, "chat.completion.chunk", s.rid)
        if whole:
            message = {"role": "assistant", "content": s.text()}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(s)}
        if tail:
            return [{**head, "choices": [], "usage": _usage(s)}] if include_usage else []
        delta: dict[str, Any] = {"content": s.text(s.generated - 1)}
        if s.generated == 1:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "finish_reason": "length" if s.done else None}
        return [{**head, "choices": [choice], "usage": None}]

    return await _run(request, count_tokens(prompt), max_new, stream, render)


__all__ = ["TOKENIZER_DIR", "build_app", "build_dummy_app"]
