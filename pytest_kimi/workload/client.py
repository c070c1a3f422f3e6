"""Streaming benchmark client (httpx, asyncio) for SGLang's three APIs.

It measures what ``sglang.bench_serving`` measures: ``send_time`` just before the request
goes out, the arrival time of every chunk that carries generated text, and the end of the
stream. Token counts come from the server (``meta_info`` or ``usage``), never from a local
tokenizer.

Connection policy: by default every request opens a new connection (``pooled=False``), as
bench_serving does with one aiohttp session per request. Streaming through the SGLang Router
over a reused keep-alive connection adds ~20-45 ms to TTFT (Nagle + delayed ACK on the
router side), while a new connection costs ~1-2 ms. ``pooled=True`` is there to measure that.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from pytest_kimi.workload.records import Chunk, RequestRecord

API_PATHS = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


@dataclass(frozen=True)
class ClientOptions:
    """How to send the workload."""

    api: str = "generate"
    output_len: int = 512
    concurrency: int = 8
    request_rate: float = float("inf")  # Poisson arrivals when finite
    timeout_s: float = 3600.0
    pooled: bool = False
    model: str = "default"
    seed: int = 0


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt and its nominal length."""

    prompt_id: str
    text: str
    nominal_tokens: int


def payload(api: str, text: str, output_len: int, model: str) -> dict[str, Any]:
    """Request body: temperature 0, fixed output length, ignore EOS (as bench_serving)."""
    if api == "generate":
        sampling = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
        return {"text": text, "sampling_params": sampling, "stream": True}
    common = {
        "model": model,
        "temperature": 0.0,
        "max_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "completions":
        return {**common, "prompt": text}
    if api == "chat":
        return {**common, "messages": [{"role": "user", "content": text}]}
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_PATHS)}")


class _StreamParser:
    """Turns SSE data lines into (tokens in this chunk, has text) and final counts."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.replica: str | None = None
        self._seen = 0

    def feed(self, data: dict[str, Any]) -> int:
        """Tokens newly carried by this chunk (0 for chunks without generated text)."""
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise _ServerError(str(message))
        if self.api == "generate":
            meta = data.get("meta_info") or {}
            self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
            total = meta.get("completion_tokens")
            if total is None:
                return 1 if data.get("text") else 0
            new = int(total) - self._seen
            self._seen = int(total)
            self.completion_tokens = self._seen
            return new if data.get("text") else 0
        usage = data.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
        choices = data.get("choices") or []
        if not choices:
            return 0
        choice = choices[0]
        text = (
            choice.get("text")
            if self.api == "completions"
            else ((choice.get("delta") or {}).get("content"))
        )
        return 1 if text else 0


class _ServerError(Exception):
    """An error object inside the stream."""


async def send_one(
    http: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    api: str,
    timeout_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """Send one streaming request and fill ``record``; failures are recorded, not raised."""
    parser = _StreamParser(api)
    record.send_time = clock()
    try:
        async with asyncio.timeout(timeout_s):
            async with http.stream("POST", url, json=body) as response:
                record.status = response.status_code
                record.replica = response.headers.get("x-kimi-replica")
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:500]
                    raise _ServerError(f"HTTP {response.status_code}: {text}")
                done = False
                async for line in response.aiter_lines():
                    now = clock()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    tokens = parser.feed(json.loads(data))
                    if tokens > 0:
                        if record.first_token_time is None:
                            record.first_token_time = now
                        record.chunks.append(Chunk(now, tokens))
                record.end_time = clock()
                if not done:
                    raise _ServerError("stream ended without [DONE]")
        record.success = record.first_token_time is not None
        if not record.success:
            record.error = "stream carried no generated text"
    except TimeoutError:
        record.error = f"timeout: no complete response within {timeout_s:g}s"
    except _ServerError as exc:
        record.error = str(exc)
    except json.JSONDecodeError as exc:
        record.error = f"malformed SSE data: {exc}"
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    if record.end_time is None:
        record.end_time = clock()
    record.prompt_tokens = parser.prompt_tokens
    record.completion_tokens = parser.completion_tokens
    return record


def _client(pooled: bool, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None if pooled else 0)
    return httpx.AsyncClient(
        limits=limits, timeout=httpx.Timeout(timeout_s, connect=30.0), trust_env=False
    )


async def run_requests(
    base_url: str,
    requests: Sequence[RequestSpec],
    options: ClientOptions,
    *,
    warmup: Sequence[RequestSpec] = (),
    on_done: Callable[[RequestRecord], None] = lambda record: None,
) -> list[RequestRecord]:
    """Send ``warmup`` one by one (kept, marked), then ``requests`` at fixed concurrency."""
    url = base_url.rstrip("/") + API_PATHS[options.api]
    records: list[RequestRecord] = []
    async with _client(options.pooled, options.timeout_s) as http:
        for i, spec in enumerate(warmup):
            record = _new_record(-1 - i, spec, options, warmup=True)
            body = payload(options.api, spec.text, options.output_len, options.model)
            records.append(await send_one(http, url, body, record, options.api, options.timeout_s))
        semaphore = asyncio.Semaphore(options.concurrency)
        rng = random.Random(options.seed)

        async def one(index: int, spec: RequestSpec) -> RequestRecord:
            async with semaphore:
                record = _new_record(index, spec, options)
                body = payload(options.api, spec.text, options.output_len, options.model)
                await send_one(http, url, body, record, options.api, options.timeout_s)
                on_done(record)
                return record

        tasks = []
        for index, spec in enumerate(requests):
            tasks.append(asyncio.create_task(one(index, spec)))
            if options.request_rate != float("inf") and index + 1 < len(requests):
                await asyncio.sleep(rng.expovariate(options.request_rate))
        records.extend(await asyncio.gather(*tasks))
    return records


def _new_record(
    index: int, spec: RequestSpec, options: ClientOptions, warmup: bool = False
) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=spec.prompt_id,
        nominal_input_tokens=spec.nominal_tokens,
        max_output_tokens=options.output_len,
        warmup=warmup,
    )
