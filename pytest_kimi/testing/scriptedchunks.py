"""What the scripted server streams on each API: SGLang 0.5.9's chunks, one class per endpoint.

``/generate``: cumulative ``text`` and ``meta_info``. Completions (``serving_completions.py``):
``text_completion`` chunks, a final usage chunk when ``stream_options.include_usage`` asks.
Chat (``serving_chat.py`` with a reasoning parser): a role chunk, ``delta.reasoning_content``
chunks, then ``delta.content`` chunks, a finish chunk, the usage chunk when asked (per-chunk
usage with ``continuous_usage_stats``). Only the bytes are here; when they are written, and
what is stamped around each write, is the server's (:mod:`pytest_kimi.testing.scripted`).
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar


class Chunks:
    """One request's chunks on one API: ``render(done, n, kind)`` is the SSE bytes of a chunk
    of ``n`` tokens (``done`` so far, ``kind`` "reasoning" or "answer"), ``tail(done)`` what
    goes before ``[DONE]``. ``entry`` is the request's truth record (its index, its prompt's
    token count)."""

    reasoning: ClassVar[bool] = False  # whether the API streams reasoning apart (chat only)

    def __init__(self, body: dict[str, Any], entry: dict[str, Any]) -> None:
        self.body, self.entry = body, entry

    @staticmethod
    def prompt(body: dict[str, Any]) -> str:
        """The request's prompt text (what the truth hashes and counts)."""
        raise NotImplementedError

    def render(self, done: int, n: int, kind: str) -> bytes:
        raise NotImplementedError

    def tail(self, done: int) -> bytes:
        return b""


class GenerateChunks(Chunks):
    """``/generate``: no reasoning field (SGLang 0.5.9), the whole text so far in each chunk."""

    def __init__(self, body: dict[str, Any], entry: dict[str, Any]) -> None:
        super().__init__(body, entry)
        self.total = entry["script"]["max_new_tokens"]

    @staticmethod
    def prompt(body: dict[str, Any]) -> str:
        return body.get("text") or ""

    def render(self, done: int, n: int, kind: str) -> bytes:
        meta = {
            "id": str(self.entry["index"]),
            "prompt_tokens": self.entry["prompt_tokens"],
            "completion_tokens": done,
            "finish_reason": {"type": "length", "length": done} if done == self.total else None,
        }
        return f"data: {json.dumps({'text': ' tok' * done, 'meta_info': meta})}\n\n".encode()


class CompletionChunks(Chunks):
    """``/v1/completions``: no reasoning field (SGLang 0.5.9)."""

    def __init__(self, body: dict[str, Any], entry: dict[str, Any]) -> None:
        super().__init__(body, entry)
        self.options = body.get("stream_options") or {}
        self.rid, self.model = f"cmpl-{entry['index']}", body.get("model", "default")
        self.created, self.total = int(time.time()), entry["script"]["max_new_tokens"]

    @staticmethod
    def prompt(body: dict[str, Any]) -> str:
        prompt = body.get("prompt") or ""
        return prompt if isinstance(prompt, str) else str(prompt)

    def render(self, done: int, n: int, kind: str) -> bytes:
        choice = {"index": 0, "text": " tok" * n, "logprobs": None,
                  "finish_reason": "length" if done == self.total else None,
                  "matched_stop": None}  # fmt: skip
        usage = _usage(self.entry, done) if self.options.get("continuous_usage_stats") else None
        data = {"id": self.rid, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [choice], "usage": usage}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n".encode()

    def tail(self, done: int) -> bytes:
        if not self.options.get("include_usage"):
            return b""
        usage = {k: v for k, v in _usage(self.entry, done).items() if v is not None}
        data = {
            "id": self.rid,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }  # fmt: skip  (exclude_none, as 0.5.9)
        return f"data: {json.dumps(data)}\n\n".encode()


class ChatChunks(Chunks):
    """``/v1/chat/completions`` with a reasoning parser: reasoning, then answer."""

    reasoning = True

    def __init__(self, body: dict[str, Any], entry: dict[str, Any]) -> None:
        super().__init__(body, entry)
        self.options = body.get("stream_options") or {}
        self.rid, self.model = f"chatcmpl-{entry['index']}", body.get("model", "default")

    @staticmethod
    def prompt(body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        data = {"id": self.rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model, "choices": choices, "usage": usage}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n".encode()

    def render(self, done: int, n: int, kind: str) -> bytes:
        delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
        delta["reasoning_content" if kind == "reasoning" else "content"] = " tok" * n
        first = b""
        if done == n:  # SGLang's role chunk goes out with the first generated text
            role = {**delta, "role": "assistant", "content": "", "reasoning_content": None}
            first = self.chunk([_choice(role)], None)
        continuous = self.options.get("continuous_usage_stats")
        per_chunk = _usage(self.entry, done) if continuous else None
        return first + self.chunk([_choice(delta)], per_chunk)

    def tail(self, done: int) -> bytes:
        empty = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
        out = self.chunk([_choice(empty, "length")], None)
        if self.options.get("include_usage"):
            out += self.chunk([], _usage(self.entry, done))
        return out


API_CHUNKS: dict[str, type[Chunks]] = {
    "/generate": GenerateChunks,
    "/v1/completions": CompletionChunks,
    "/v1/chat/completions": ChatChunks,
}


def _usage(entry: dict[str, Any], done: int) -> dict[str, Any]:
    """SGLang 0.5.9's ``UsageInfo`` (its chat never fills ``reasoning_tokens``)."""
    prompt = entry["prompt_tokens"]
    return {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done,
            "prompt_tokens_details": None, "reasoning_tokens": 0}  # fmt: skip


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
            "matched_stop": None}  # fmt: skip
