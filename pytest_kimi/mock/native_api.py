"""SGLang's native ``POST /generate``: each streamed chunk carries the cumulative text and
token ids so far and ``meta_info`` (token counts, finish reason, timings); ``/abort_request``
ends a running request by its ``rid``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pytest_kimi.mock.decodeside import DecodeSide
from pytest_kimi.mock.generation import prompt_tokens, run_generation, sampling
from pytest_kimi.mock.http_common import (
    ARGS_KEY,
    ENGINE_KEY,
    METRICS_KEY,
    SIDE_KEY,
    BadRequest,
    GenerateRefused,
    read_body,
    sse_answer,
)
from pytest_kimi.mock.prefillside import PrefillSide
from pytest_kimi.mock.reqstate import State
from pytest_kimi.mock.wire.errors import NO_PROMPT, generate_error, too_long

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default


async def generate(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    args = request.app[ARGS_KEY]
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    if "text" not in body and "input_ids" not in body:
        raise GenerateRefused(NO_PROMPT)
    prompt = body["input_ids"] if "input_ids" in body else body.get("text")
    max_new, _ = sampling(params, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    stream = bool(body.get("stream", False))
    count = prompt_tokens(prompt)
    asked = params.get("max_new_tokens")
    problem = too_long(count, asked if isinstance(asked, int) else 0, args.context_length)
    if problem is not None:  # SGLang's tokenizer manager raises it inside the stream
        if stream:
            return await sse_answer(request, generate_error(args.wire, problem, True))
        raise GenerateRefused(problem)

    def render(s: State, whole: bool = False, tail: bool = False) -> Any:
        if tail:
            return []
        out = {"text": s.text(), "output_ids": s.output_ids(), "meta_info": s.meta()}
        return out if whole else [out]

    return await run_generation(request, count, max_new, stream, render, body, prompt)


async def abort_request(request: web.Request) -> web.Response:
    """SGLang's ``/abort_request``: ``{"rid": ...}`` or ``{"abort_all": true}``; an empty 200
    whatever it found. A request it ends answers with an abort finish reason; each counts in
    ``sglang:num_aborted_requests_total``."""
    body = await read_body(request)
    engine, metrics = request.app[ENGINE_KEY], request.app[METRICS_KEY]
    rids = list(engine.streams) if body.get("abort_all") else [body.get("rid")]
    side = request.app.get(SIDE_KEY)
    for rid in rids:
        if isinstance(rid, str) and rid in engine.streams:
            metrics.aborted()
            engine.abort(rid, notify=True)
            if isinstance(side, PrefillSide | DecodeSide):
                side.forget(rid)
    return web.Response(status=200)
