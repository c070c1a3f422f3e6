"""SGLang's OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``: streamed
deltas, usage in every chunk when ``stream_options.continuous_usage_stats`` asks for it, and
a final usage chunk when ``stream_options.include_usage`` does; objects in the wire version's
shape (:mod:`pytest_kimi.mock.wire.openai_shapes`).

A chat stream is a role chunk, content chunks and a finish chunk of its own. With
``--mock-reasoning-tokens N`` its first N tokens are a reasoning model's thinking, sent as
SGLang sends them with a reasoning parser (``serving_chat.py``): ``delta.reasoning_content``
chunks after the role chunk, then the answer. Usage counts all tokens; its
``reasoning_tokens`` is the thinking so far under 0.5.23's wire and 0 under 0.5.9's, as
each version's own usage says."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from pytest_kimi.mock.generation import prompt_tokens, run_generation, sampling
from pytest_kimi.mock.http_common import ARGS_KEY, BadRequest, read_body, sse_answer
from pytest_kimi.mock.reqstate import State
from pytest_kimi.mock.tokenizer_files import count_tokens
from pytest_kimi.mock.wire import openai_shapes as shapes
from pytest_kimi.mock.wire.errors import error_response, openai_refusal_streams, too_long


def _head(body: dict[str, Any], kind: str, rid: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": body.get("model")}


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(usage chunk at the end, usage in every chunk)."""
    options = body.get("stream_options") or {}
    return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


async def _refuse_if_too_long(request: web.Request, body: dict[str, Any], prompt: int,
                              asked: Any) -> web.StreamResponse | None:  # fmt: skip
    """SGLang's length checks: a 400, or (0.5.9, streamed) a 200 stream of the error."""
    args = request.app[ARGS_KEY]
    problem = too_long(prompt, asked if isinstance(asked, int) else 0, args.context_length)
    if problem is None:
        return None
    if body.get("stream") and openai_refusal_streams(args.wire):
        return await sse_answer(request, {"error": error_response(problem)})
    raise BadRequest(problem, kind="BadRequestError")


async def completions(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    if "prompt" not in body:
        raise BadRequest("1 validation error: prompt: Field required")
    version = request.app[ARGS_KEY].wire
    max_new, stream = sampling(body, "max_tokens", 16)
    include_usage, continuous = _stream_options(body)
    prompt = prompt_tokens(body.get("prompt"))
    refused = await _refuse_if_too_long(request, body, prompt, body.get("max_tokens", 16))
    if refused is not None:
        return refused

    def render(s: State, whole: bool = False, tail: bool = False) -> Any:
        head = _head(body, "text_completion", s.rid)
        if whole:
            return {**head, "choices": [shapes.completion_choice(s.text(), s.finish)],
                    "usage": shapes.usage(version, s.prompt, s.generated, cached=s.cached),
                    "metadata": shapes.metadata(version, s.generated)}  # fmt: skip
        if tail:
            use = shapes.usage(version, s.prompt, s.generated, final_completions=True,
                               cached=s.cached)  # fmt: skip
            return [shapes.usage_chunk(head, use)] if include_usage else []
        use = shapes.usage(version, s.prompt, s.generated, cached=s.cached) if continuous else None
        return [{**head, "choices": [shapes.completion_choice(s.new_text(), s.finish)],
                 "usage": use}]  # fmt: skip

    return await run_generation(request, prompt, max_new, stream, render, body,
                                body.get("prompt"))  # fmt: skip


async def chat(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    if "messages" not in body:
        raise BadRequest("1 validation error: messages: Field required")
    args = request.app[ARGS_KEY]
    max_new, stream = sampling(body, "max_tokens", 16)
    if "max_completion_tokens" in body:
        max_new, _ = sampling(body, "max_completion_tokens", max_new)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("Messages cannot be empty.", kind="BadRequestError")
    prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    refused = await _refuse_if_too_long(request, body, count_tokens(prompt), asked)
    if refused is not None:
        return refused
    render = _chat_render(body, args.wire, min(max_new, max(0, args.mock_reasoning_tokens)))
    return await run_generation(request, count_tokens(prompt), max_new, stream, render, body,
                                prompt)  # fmt: skip


def _chat_render(body: dict[str, Any], version: str, thinking: int) -> Any:
    include_usage, continuous = _stream_options(body)

    def render(s: State, whole: bool = False, tail: bool = False) -> Any:
        head = _head(body, "chat.completion.chunk", s.rid)
        use = shapes.usage(version, s.prompt, s.generated, reasoning=min(thinking, s.generated),
                           cached=s.cached)  # fmt: skip
        if whole:
            return {**head, "object": "chat.completion",
                    "choices": [shapes.chat_choice(version, s.text(), s.finish)],
                    "usage": use, "metadata": shapes.metadata(version, s.generated)}  # fmt: skip
        if tail:
            return [shapes.usage_chunk(head, use)] if include_usage else []
        return _chat_chunks(version, head, s, thinking, use if continuous else None)

    return render


def _chat_chunks(version: str, head: dict[str, Any], s: State, thinking: int,
                 use: dict[str, Any] | None) -> list[dict[str, Any]]:  # fmt: skip
    """One output's chunks: the role chunk first of all; the thinking part of its tokens as
    ``reasoning_content``, the rest as ``content``; a finish chunk once it is the last."""
    chunks = []
    if s.before == 0:
        role = shapes.delta(version, role="assistant", content="")
        chunks.append(shapes.chat_chunk(version, head, role))
    split = min(max(s.before, thinking), s.generated)
    if split > s.before:  # SGLang's parser splits a step's text, the reasoning part first
        reasoning = shapes.delta(version, reasoning_content=s.span(s.before, split))
        chunks.append(shapes.chat_chunk(version, head, reasoning, use=use))
    if s.generated > split:
        content = shapes.delta(version, content=s.span(split, s.generated))
        chunks.append(shapes.chat_chunk(version, head, content, use=use))
    if s.finish is not None:
        chunks.append(shapes.chat_chunk(version, head, shapes.delta(version), s.finish))
    return chunks
