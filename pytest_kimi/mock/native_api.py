"""SGLang's native ``POST /generate``: each streamed chunk carries the cumulative text so far
and ``meta_info`` (token counts, finish reason, latency)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pytest_kimi.mock.generation import State, prompt_tokens, run_generation, sampling
from pytest_kimi.mock.http_common import BadRequest, read_body


async def generate(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    prompt = body["input_ids"] if "input_ids" in body else body.get("text")
    max_new, stream = sampling(params, "max_new_tokens", 128)
    stream = bool(body.get("stream", False))

    def render(s: State, whole: bool = False, tail: bool = False) -> Any:
        if whole:
            return {"text": s.text(), "meta_info": s.meta()}
        if tail:
            return []
        return [{"text": s.text(), "meta_info": s.meta()}]

    return await run_generation(request, prompt_tokens(prompt), max_new, stream, render, body,
                                prompt)  # fmt: skip
