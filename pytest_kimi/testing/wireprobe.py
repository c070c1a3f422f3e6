"""The same requests to any SGLang server, real or mock, and its answers as data.

``scripts/capture_sglang_wire.py`` runs this against a real server to record a version's wire
(:mod:`pytest_kimi.mock.wire`); ``tests/conformance/test_mock_vs_sglang.py`` runs it against a
real server and the mock of the same version and compares the two transcripts. The traffic
touches every API, streamed and not (with and without ``stream_options``), a prompt longer
than the context, bad bodies, the info endpoints the product reads, and both ways a request
is aborted (a client that goes away mid-stream, ``/abort_request``), with ``/metrics`` read
before any of it and after each part. Waits are polls with deadlines, never sleeps that hope.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_kimi.workload import http

NEW_TOKENS = 16  # enough tokens that a stream has first, middle and last chunks
LONG_RUN_TOKENS = 3000  # a request that runs until it is aborted
ABORTED_METRIC = "sglang:num_aborted_requests_total"
DEADLINE_S = 120.0


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, headers (names lower-cased) and body, parsed by its kind:
    ``json`` (a value), ``sse`` (a list of events: JSON values, ``"[DONE]"`` or raw text),
    ``empty`` (``None``) or ``text``."""

    status: int
    headers: dict[str, str]
    kind: str
    body: Any


@dataclass
class Transcript:
    """A server's answers by step name, and its ``/metrics`` text at each checkpoint."""

    answers: dict[str, Answer] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One request: ``body`` is sent as JSON, ``raw`` as bytes with a JSON content type."""

    name: str
    method: str
    path: str
    body: Any = None
    raw: bytes | None = None


def _words(count: int, start: int = 1) -> str:
    """``count`` words of the tiny model's vocabulary (``w0`` .. ``w999``): one token each."""
    return " ".join(f"w{(start + i) % 1000}" for i in range(count))


def _generate(text: str, tokens: int, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": tokens, "ignore_eos": True}
    return {"text": text, "sampling_params": params, **extra}


def _completions(prompt: str, tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, **extra}


def _chat(content: str, tokens: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": "m", "messages": messages, "max_tokens": tokens, "ignore_eos": True,
            **extra}  # fmt: skip


USAGE = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}

INFO_STEPS = tuple(
    Step(f"info{path}", "GET", path)
    for path in ("/health", "/health_generate", "/get_model_info", "/model_info",
                 "/get_server_info", "/server_info", "/v1/models", "/get_load", "/nonexistent")
)  # fmt: skip


def traffic_steps() -> tuple[Step, ...]:
    """Each API, whole and streamed; the OpenAI ones also with usage in every chunk."""
    prompt = _words(5)
    return (
        Step("generate", "POST", "/generate", _generate(prompt, NEW_TOKENS)),
        Step("generate/stream", "POST", "/generate", _generate(prompt, NEW_TOKENS, stream=True)),
        Step("completions", "POST", "/v1/completions", _completions(prompt, NEW_TOKENS)),
        Step("completions/stream", "POST", "/v1/completions",
             _completions(prompt, NEW_TOKENS, stream=True)),
        Step("completions/stream+usage", "POST", "/v1/completions",
             _completions(prompt, NEW_TOKENS, **USAGE)),
        Step("chat", "POST", "/v1/chat/completions", _chat(prompt, NEW_TOKENS)),
        Step("chat/stream", "POST", "/v1/chat/completions",
             _chat(prompt, NEW_TOKENS, stream=True)),
        Step("chat/stream+usage", "POST", "/v1/chat/completions",
             _chat(prompt, NEW_TOKENS, **USAGE)),
        Step("freeze_gc", "POST", "/freeze_gc"),
        Step("flush_cache", "POST", "/flush_cache"),
    )  # fmt: skip


def error_steps(context_length: int) -> tuple[Step, ...]:
    """A prompt longer than the context, and bodies SGLang refuses."""
    long = _words(context_length + 8)
    bad = b"{not json"
    return (
        Step("long/generate", "POST", "/generate", _generate(long, 4)),
        Step("long/generate/stream", "POST", "/generate", _generate(long, 4, stream=True)),
        Step("long/completions", "POST", "/v1/completions", _completions(long, 4)),
        Step("long/completions/stream", "POST", "/v1/completions",
             _completions(long, 4, stream=True)),
        Step("long/chat", "POST", "/v1/chat/completions", _chat(long, 4)),
        Step("long/chat/stream", "POST", "/v1/chat/completions", _chat(long, 4, stream=True)),
        Step("too-many-new/generate", "POST", "/generate",
             _generate(_words(8), context_length)),
        Step("bad-json/generate", "POST", "/generate", raw=bad),
        Step("bad-json/completions", "POST", "/v1/completions", raw=bad),
        Step("bad-json/chat", "POST", "/v1/chat/completions", raw=bad),
        Step("missing/generate", "POST", "/generate", {}),
        Step("missing/completions", "POST", "/v1/completions", {}),
        Step("missing/chat", "POST", "/v1/chat/completions", {}),
        Step("empty-messages/chat", "POST", "/v1/chat/completions", {"model": "m", "messages": []}),
    )  # fmt: skip


def parse(response: httpx.Response) -> Answer:
    """An answer as data: its body by content type (see :class:`Answer`)."""
    headers = {k.lower(): v for k, v in response.headers.items()}
    ctype = headers.get("content-type", "")
    text = response.text
    if "text/event-stream" in ctype:
        kind, body = "sse", [_event(line[6:]) for line in text.splitlines()
                             if line.startswith("data: ")]  # fmt: skip
    elif "json" in ctype:
        kind, body = "json", json.loads(text) if text else None
    elif not text:
        kind, body = "empty", None
    else:
        kind, body = "text", text
    return Answer(response.status_code, headers, kind, body)


def _event(data: str) -> Any:
    if data == "[DONE]":
        return data
    try:
        return json.loads(data)
    except ValueError:
        return data


def send(client: httpx.Client, step: Step) -> Answer:
    if step.raw is not None:
        headers = {"content-type": "application/json"}
        return parse(client.request(step.method, step.path, content=step.raw, headers=headers))
    return parse(client.request(step.method, step.path, json=step.body))


def run_probe(url: str, context_length: int) -> Transcript:
    """Every step against the server at ``url``, in order; see the module docstring."""
    out = Transcript()
    with http.client(base_url=url, timeout=DEADLINE_S) as client:
        out.metrics["ready"] = client.get("/metrics").text
        for step in INFO_STEPS + traffic_steps():
            out.answers[step.name] = send(client, step)
        out.metrics["traffic"] = client.get("/metrics").text
        for step in error_steps(context_length):
            out.answers[step.name] = send(client, step)
        out.metrics["errors"] = client.get("/metrics").text
        _disconnect_mid_stream(client)
        out.metrics["disconnect"] = _metrics_once(client, ABORTED_METRIC)
        out.answers.update(_abort_request_whole(client))
        out.answers.update(_abort_request_stream(client))
        out.metrics["aborted"] = client.get("/metrics").text
    return out


def _disconnect_mid_stream(client: httpx.Client) -> None:
    """A client that reads two chunks of a long stream and goes away."""
    body = _generate(_words(4), LONG_RUN_TOKENS, stream=True)
    with client.stream("POST", "/generate", json=body) as response:
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events == 2:
                break


def _metrics_once(client: httpx.Client, name: str) -> str:
    """``/metrics`` once it holds ``name`` (an abort is counted once the server notices the
    client left); after :data:`DEADLINE_S` without it, what it holds then."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = client.get("/metrics").text
        if f"# TYPE {name}" in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def _running(client: httpx.Client) -> float:
    """``sglang:num_running_reqs``: the scheduler's running batch, requests past their
    prefill (a waiting one is aborted by SGLang's tokenizer manager with another answer)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("sglang:num_running_reqs{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _idle(client: httpx.Client) -> None:
    """A one-token request, and more until ``sglang:num_running_reqs`` reads 0. 0.5.9's
    scheduler sets the gauge only when it logs a prefill (the batch running beside it) or
    every 40th decode step, so after the client that went away it still says 1 while nothing
    runs; a request that ends at its prefill logs the truth. (Its answer can come before the
    log: hence the loop. The mock's gauge is live, so it gets the first request only.)"""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        send(client, Step("idle", "POST", "/generate", _generate(_words(2, start=900), 1)))
        if _running(client) == 0 or time.monotonic() > deadline:
            return


def _abort_request_whole(client: httpx.Client) -> dict[str, Answer]:
    """A long non-streamed ``/generate`` aborted by ``/abort_request`` with its ``rid`` once
    the server says it runs (the gauge first seen at 0, so a 1 is this request past its
    prefill, not a stale count; aborted before that, SGLang answers "Abort in waiting queue"
    with another shape); the abort is resent until the request answers (one that comes
    before the server knows the request aborts nothing)."""
    rid = "kimi-probe-abort-whole"
    body = _generate(_words(3), LONG_RUN_TOKENS, rid=rid)
    _idle(client)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(send, client, Step("run", "POST", "/generate", body))
        deadline = time.monotonic() + DEADLINE_S
        while _running(client) < 1 and not pending.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        abort = send(client, Step("abort", "POST", "/abort_request", {"rid": rid}))
        while not pending.done() and time.monotonic() < deadline:
            time.sleep(0.05)
            abort = send(client, Step("abort", "POST", "/abort_request", {"rid": rid}))
        return {"abort/generate": pending.result(), "abort/abort_request": abort}


def _abort_request_stream(client: httpx.Client) -> dict[str, Answer]:
    """A long chat stream aborted by ``/abort_request`` once its first content has come."""
    rid = "kimi-probe-abort-stream"
    body = _chat(_words(3), LONG_RUN_TOKENS, stream=True, rid=rid)
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines, aborted = [], False
        for line in response.iter_lines():
            lines.append(line)
            if not aborted and sum(x.startswith("data: ") for x in lines) >= 2:
                send(client, Step("abort", "POST", "/abort_request", {"rid": rid}))
                aborted = True
        events = [_event(x[6:]) for x in lines if x.startswith("data: ")]
        headers = {k.lower(): v for k, v in response.headers.items()}
        return {"abort/chat/stream": Answer(response.status_code, headers, "sse", events)}
