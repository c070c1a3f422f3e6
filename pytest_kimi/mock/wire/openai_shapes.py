"""The OpenAI routes' objects as each SGLang version writes them
(``srt/entrypoints/openai/protocol.py``, ``serving_completions.py``, ``serving_chat.py``).

What differs: 0.5.23's usage has ``completion_tokens_details``, its ``metadata`` names the
weight versions of the output's tokens, its chat message has no ``tool_calls``, and its chat
stream chunks leave out what is unset (no ``usage`` key, a delta of ``reasoning_content`` and
what the chunk carries), where 0.5.9 writes every field, null or not. Both stream chat as a
role chunk, content chunks and a finish chunk of its own; the usage-only chunk of a
completions stream has neither ``prompt_tokens_details`` nor ``completion_tokens_details``.
"""

from __future__ import annotations

from typing import Any


def _new(version: str) -> bool:
    return version != "0.5.9"


def usage(
    version: str, prompt: int, completion: int, final_completions: bool = False, reasoning: int = 0,
    cached: int | None = None,
) -> dict:  # fmt: skip
    """``UsageInfo``; ``final_completions``: the usage-only last chunk of a completions stream,
    dumped without its unset detail fields. ``reasoning``: thinking tokens so far, which
    0.5.23 counts (the scheduler's ``reasoning_tokens``, also as OpenAI's
    ``completion_tokens_details``, set only when there are some: ``usage_processor.py``) and
    0.5.9 reports as 0 (from each version's source: a reasoning parser needs a real model).
    ``cached``: prompt tokens found cached, under ``--enable-cache-report`` only (both
    versions: ``{"cached_tokens": n}``, also 0; ``usage_processor.py``)."""
    counted = reasoning if _new(version) else 0
    out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                           "completion_tokens": completion}  # fmt: skip
    details = None if cached is None else {"cached_tokens": cached}
    if final_completions:
        extra = {} if details is None else {"prompt_tokens_details": details}
        return {**out, **extra, "reasoning_tokens": counted}
    out.update(prompt_tokens_details=details, reasoning_tokens=counted)
    if _new(version):
        out["completion_tokens_details"] = {"reasoning_tokens": counted} if counted else None
    return out


def metadata(version: str, completion: int) -> dict[str, Any]:
    out: dict[str, Any] = {"weight_version": "default"}
    if _new(version):
        out["weight_versions"] = [{"version": "default", "start": 0, "end": completion}]
    return out


def completion_choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
            "matched_stop": None}  # fmt: skip


def chat_message(version: str, text: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None}
    if not _new(version):
        message["tool_calls"] = None
    return message


def chat_choice(version: str, text: str, finish: str | None) -> dict[str, Any]:
    return {"index": 0, "message": chat_message(version, text), "logprobs": None,
            "finish_reason": finish, "matched_stop": None}  # fmt: skip


def delta(version: str, **fields: Any) -> dict[str, Any]:
    """``DeltaMessage`` with ``fields`` set: 0.5.9 writes every field, 0.5.23 only
    ``reasoning_content`` and the set ones."""
    if _new(version):
        return {"reasoning_content": None, **fields}
    return {"role": None, "content": None, "reasoning_content": None, "tool_calls": None,
            **fields}  # fmt: skip


def chat_chunk(version: str, head: dict[str, Any], delta_: dict[str, Any],
               finish: str | None = None, use: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``ChatCompletionStreamResponse``."""
    choice = {"index": 0, "delta": delta_, "logprobs": None, "finish_reason": finish,
              "matched_stop": None}  # fmt: skip
    chunk = {**head, "choices": [choice]}
    if use is not None or not _new(version):
        chunk["usage"] = use
    return chunk


def usage_chunk(head: dict[str, Any], use: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream that asked for usage: no choices."""
    return {**head, "choices": [], "usage": use}
