"""SGLang's OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``: streamed
deltas, and a final usage chunk when ``stream_options.include_usage`` asks for one.

With ``--mock-reasoning-tokens N`` a chat stream's first N tokens are a reasoning model's
thinking, sent as SGLang 0.5.9 sends them with a reasoning parser (``serving_chat.py``): a role
chunk, then ``delta.reasoning_content`` chunks (every delta field present, null but one), then
the answer. Usage counts all tokens; like 0.5.9 its ``reasoning_tokens`` is not filled in."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from pytest_kimi.mock.generation import State, prompt_tokens, run_generation, sampling
from pytest_kimi.mock.http_common import ARGS_KEY, BadRequest, read_body
from pytest_kimi.mock.tokenizer_files import count_tokens


def _head(body: dict[str, Any], kind: str, rid: str) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": body.get("model")}


def _usage(s: State) -> dict[str, int]:
    return {
        "prompt_tokens": s.prompt,
        "completion_tokens": s.generated,
        "total_tokens": s.prompt + s.generated,
    }


async def completions(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    max_new, stream = sampling(body, "max_tokens", 16)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def render(s: State, whole: bool = False, tail: bool = False) -> Any:
        head = _head(body, "text_completion", s.rid)
        if whole:
            choice = {"index": 0, "text": s.text(), "logprobs": None, "finish_reason": "length"}
            return {**head, "choices": [choice], "usage": _usage(s)}
        if tail:
            return [{**head, "choices": [], "usage": _usage(s)}] if include_usage else []
        finish = "length" if s.done else None
        choice = {
            "index": 0,
            "text": s.new_text(),
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": None,
        }
        return [{**head, "choices": [choice], "usage": None}]

    prompt = prompt_tokens(body.get("prompt"))
    return await run_generation(request, prompt, max_new, stream, render, body,
                                body.get("prompt"))  # fmt: skip


async def chat(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    max_new, stream = sampling(body, "max_tokens", 16)
    if "max_completion_tokens" in body:
        max_new, _ = sampling(body, "max_completion_tokens", max_new)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    thinking = min(max_new, max(0, request.app[ARGS_KEY].mock_reasoning_tokens))

    def render(s: State, whole: bool = False, tail: bool = False) -> Any:
        head = _head(body, "chat.completion.chunk", s.rid)
        if whole:
            message = {"role": "assistant", "content": s.text()}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(s)}
        if tail:
            return [{**head, "choices": [], "usage": _usage(s)}] if include_usage else []
        if s.generated <= thinking:
            return _reasoning_chunks(head, s, s.new_text())
        chunks, answer_from = [], s.before
        if s.before < thinking:  # one speculative step ends the thinking: SGLang's parser
            # splits its text, the reasoning part first
            chunks, answer_from = _reasoning_chunks(head, s, s.span(s.before, thinking)), thinking
        delta: dict[str, Any] = {"content": s.span(answer_from, s.generated)}
        if s.before == 0 and not chunks:  # (after thinking, the role chunk has gone out)
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "finish_reason": "length" if s.done else None}
        return [*chunks, {**head, "choices": [choice], "usage": None}]

    return await run_generation(request, count_tokens(prompt), max_new, stream, render, body,
                                prompt)  # fmt: skip


def _reasoning_chunks(head: dict[str, Any], s: State, text: str) -> list[dict[str, Any]]:
    """Thinking tokens as SGLang 0.5.9 streams them: ``DeltaMessage(reasoning_content=...)``
    dumped whole, after the role chunk (``DeltaMessage(role="assistant", content="")``) for the
    first token."""
    empty = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
    delta = {**empty, "reasoning_content": text}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
              "matched_stop": None}  # fmt: skip
    chunks = [{**head, "choices": [choice], "usage": None}]
    if s.before == 0:
        role = {**empty, "role": "assistant", "content": ""}
        chunks.insert(0, {**head, "choices": [{**choice, "delta": role}], "usage": None})
    return chunks
