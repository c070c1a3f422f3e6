"""SGLang's three streaming APIs on the wire: the request bodies, and the chunks read back.

What a request asks for (:func:`payload`: temperature 0, a fixed output length, per-chunk
usage) and how its server-sent events become the record's chunks (:func:`read_events`, with
:class:`StreamParser` for what each event carries). Token counts come from the server
(``meta_info`` or ``usage``), never from a local tokenizer. Generated text includes a
reasoning model's ``delta.reasoning_content``, as ``sglang.benchmark.serving`` (0.5.15 on)
counts it and bench_serving 0.5.9, which times only ``delta.content``, does not: TTFT is the
first token of any kind, and the first answer token is recorded next to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.workload.holds import Holds

loads = orjson.loads
DRAIN_S = 1.0  # after [DONE], how long to wait for the body to end before letting it go

API_PATHS = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


def payload(
    api: str, text: str, output_len: int, model: str, messages: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """Request body: temperature 0, fixed output length, ignore EOS (as bench_serving).
    ``messages``: the chat API's conversation (a session's), else one user message of
    ``text``; the other APIs send ``text`` (a session's conversation rendered as text)."""
    if api == "generate":
        sampling = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
        return {"text": text, "sampling_params": sampling, "stream": True}
    common = {
        "model": model,
        "temperature": 0.0,
        "max_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        # usage in every chunk: SGLang merges tokens into one chunk at times (27 chunks for
        # 32 tokens seen on a CPU), and only a count per chunk says how many each carried
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if api == "completions":
        return {**common, "prompt": text}
    if api == "chat":
        return {**common, "messages": messages or [{"role": "user", "content": text}]}
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_PATHS)}")


class StreamParser:
    """Turns SSE data lines into (tokens in this chunk, whether it is answer) and final counts.

    Reasoning: SGLang's chat API with a reasoning parser streams the thinking as
    ``delta.reasoning_content`` before the answer's ``delta.content`` (0.5.9,
    ``serving_chat.py``); both are generated tokens, so both start the clock of TTFT. Its
    ``/v1/completions`` and ``/generate`` do not separate reasoning (0.5.9 has no reasoning
    field there: the thinking is part of ``text``), so everything they stream is answer.

    Token counts: ``/generate`` carries cumulative ``meta_info.completion_tokens`` in every
    chunk. OpenAI chunks carry ``usage`` in every chunk too, as the client asks for it
    (``continuous_usage_stats``, which SGLang 0.5.9 and 0.5.23 honour); from a server that
    ignores it each chunk with text counts as one token and the total comes from the final
    usage. A token the server counted but that decoded to no text (a special token: a
    random-weight model emits them) is not a chunk of its own: it arrives with the next chunk
    that carries text, or, after the last one, at the stream's last count (:meth:`unstreamed`).
    Reasoning tokens: ``usage.reasoning_tokens`` (or OpenAI's
    ``completion_tokens_details.reasoning_tokens``) when the server reports a positive number,
    else the tokens counted in reasoning chunks (SGLang 0.5.9's chat usage always says 0).
    """

    def __init__(self, api: str, keep_text: bool = False) -> None:
        self.api = api
        self.keep_text = keep_text  # a session resends the answer: keep it (:attr:`text`)
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._texts: list[str] = []
        self.request_id: str | None = None
        self.spec_verify_ct: int | None = None
        self.spec_accept_length: float | None = None
        self._seen = 0  # tokens carried by chunks with text so far
        self._per_chunk = False  # the server counted tokens in each chunk (not only at the end)
        self._last_reasoning = 0  # tokens the last chunk with text gave to reasoning
        self._reasoning_streamed = 0
        self._reasoning_reported = 0

    @property
    def text(self) -> str:
        """The answer as streamed (reasoning left out: a chat client does not send its
        thinking back), when asked to keep it."""
        return "".join(self._texts)

    @property
    def reasoning_tokens(self) -> int:
        """The server's reasoning count where it gives one, else what streamed as reasoning."""
        return self._reasoning_reported or self._reasoning_streamed

    def feed(self, data: dict[str, Any]) -> tuple[int, bool]:
        """Tokens newly carried by this chunk (0 for chunks without generated text), and
        whether they are answer (False: reasoning)."""
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise ServerError(str(message))
        if self.api == "generate":
            return self._feed_generate(data), True
        self.request_id = data.get("id", self.request_id)
        usage = data.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            self._reasoning_reported = _reported_reasoning(usage) or self._reasoning_reported
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                self.cached_tokens = int(details["cached_tokens"])
        choices = data.get("choices") or []
        if not choices:
            return 0, False
        choice = choices[0]
        if self.api == "completions":
            answer, reasoning = choice.get("text"), None
        else:
            delta = choice.get("delta") or {}
            answer, reasoning = delta.get("content"), delta.get("reasoning_content")
        if not answer and not reasoning:
            return 0, False
        if answer and self.keep_text:
            self._texts.append(answer)
        tokens = 1
        if usage and usage.get("completion_tokens") is not None:  # continuous_usage_stats
            total = int(usage["completion_tokens"])
            tokens, self._seen, self._per_chunk = total - self._seen, total, True
        else:
            self._seen += 1
        if not answer:
            self._reasoning_streamed += tokens
            self._last_reasoning = tokens
        elif tokens == 0 and self._last_reasoning:
            # one step ended the thinking and began the answer: SGLang splits its text into a
            # reasoning chunk and a content chunk under one count, which the reasoning chunk
            # took whole; at least one of those tokens is answer (the split within the step is
            # not reported)
            self._reasoning_streamed -= 1
            self._last_reasoning = 0
        else:
            self._last_reasoning = 0
        return tokens, bool(answer)

    def _feed_generate(self, data: dict[str, Any]) -> int:
        meta = data.get("meta_info") or {}
        self.request_id = meta.get("id", self.request_id)
        self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
        if meta.get("cached_tokens") is not None:
            self.cached_tokens = int(meta["cached_tokens"])
        if self.keep_text and data.get("text") is not None:  # /generate's text is cumulative
            self._texts[:] = [data["text"]]
        if "spec_verify_ct" in meta:  # speculative decoding: the finished request's counts
            self.spec_verify_ct = int(meta["spec_verify_ct"])
            length = meta.get("spec_accept_length")
            self.spec_accept_length = None if length is None else float(length)
        total = meta.get("completion_tokens")
        if total is None:
            return 1 if data.get("text") else 0
        self.completion_tokens = int(total)
        self._per_chunk = True
        if not data.get("text"):  # counted, but no text yet: it comes with the next chunk
            return 0
        new, self._seen = self.completion_tokens - self._seen, self.completion_tokens
        return new

    def unstreamed(self) -> int:
        """Tokens the server counted after the last chunk with text (they decoded to no
        text), where it counted per chunk; 0 otherwise (a total from the final usage alone
        cannot say whether tokens were merged or unseen, nor where)."""
        if not self._per_chunk or self.completion_tokens is None:
            return 0
        return max(0, self.completion_tokens - self._seen)


def _reported_reasoning(usage: dict[str, Any]) -> int:
    """Reasoning tokens a usage object reports: SGLang's ``reasoning_tokens`` or OpenAI's
    ``completion_tokens_details.reasoning_tokens``; 0 when neither says."""
    details = usage.get("completion_tokens_details") or {}
    value = usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0
    return int(value)


class ServerError(Exception):
    """An error object inside the stream."""


async def read_events(
    response: httpx.Response,
    parser: StreamParser,
    record: RequestRecord,
    clock: Callable[[], float],
    holds: Holds,
) -> float | None:
    """Consume SSE ``data:`` lines; return when ``[DONE]`` arrived (None: it never did).

    Works on raw byte reads and stamps every event in a read with the read's arrival time:
    events that arrived together were, for the client, received together. Bytes and orjson
    keep the per-event cost low, so the client keeps up with hundreds of streams.
    """
    pending = b""
    arrival = response.extensions.get("kimi_arrival")
    pieces = response.aiter_bytes().__aiter__()
    done_at: float | None = None
    counted_at = 0.0  # when the server's token count last grew
    while True:
        try:
            if done_at is None:
                data = await anext(pieces)
            else:  # drain the body's end, so a pooled connection can be reused
                data = await asyncio.wait_for(anext(pieces), DRAIN_S)
        except (StopAsyncIteration, TimeoutError):
            return done_at
        now = arrival.time if arrival is not None else clock()
        if done_at is not None:
            continue
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done_at = now
                holds.done()
                trailing = parser.unstreamed()
                if trailing and record.chunks:  # counted after the last text: they end here
                    record.chunks.append(Chunk(counted_at, trailing))
                break
            before = parser.completion_tokens
            tokens, answer = parser.feed(loads(payload))
            if parser.completion_tokens != before:
                counted_at = now
            if tokens > 0:
                if record.first_token_time is None:
                    record.first_token_time = now
                    holds.first_token()
                record.chunks.append(Chunk(now, tokens))
            # answer text, even in a chunk whose count the reasoning chunk before it took
            if answer and record.first_answer_time is None and record.first_token_time is not None:
                record.first_answer_time = now
