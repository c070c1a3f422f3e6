"""A ground-truth server: streams SGLang's ``/generate``, ``/v1/completions`` and
``/v1/chat/completions`` chunks on a per-request script, and records what it really did.

Used to check a client's timing, not to model a GPU. Each request's script (time to first
token, gap between tokens, tokens per chunk, and for chat how many leading tokens are
reasoning) comes from the request itself (``sampling_params.script``; OpenAI APIs: a
top-level ``script``) or, for clients that cannot send one (``sglang.bench_serving``), from a
seeded generator keyed by arrival order.

The truth takes nothing from the client. Every script runs on the server's own clock from its
handler's entry: the instant the request's head is parsed, before its body is read (``head``),
as a web framework's handler starts. Around it the server stamps when the kernel handed it the
connection (``accepted``), the request's first byte (``first_byte``) and its whole body
(``received``); each chunk just before and just after its write, and the same for
``[DONE]``. Stamps are ``time.perf_counter``: CLOCK_MONOTONIC, system-wide on Linux, so a
client on this machine can place its own stamps on the same clock and split its error by
phase (see ``benchmarks/client_accuracy.py``). A late event loop is told apart too: the
kernel stamps each request's first segment as it arrives (``kernel_first``: SO_TIMESTAMPNS,
:mod:`pytest_kimi.testing.rawsocket`), so ``first_byte - kernel_first`` is how late this
server's own loop read the request, never the client's doing; each chunk keeps its scripted
``deadline`` beside its write stamps.

Chunks are SGLang 0.5.9's (:mod:`pytest_kimi.testing.scriptedchunks`). It is a bare asyncio
protocol rather than a web framework on purpose: arrival is stamped in ``data_received`` and
every chunk's write right around ``transport.write``, with no framework queueing in between.
``GET /truth`` returns what happened, per request, with the client's port; ``GET /gets`` when
every other GET (``/get_server_info``: bench_serving's last call) came in and was answered (just
before and just after its write: the server may be preempted between its write and its stamp,
while the client reads the answer).

Run: ``python -m pytest_kimi.testing.scripted --port 31000 [--ttft-ms 50 --itl-ms 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_kimi.testing.rawsocket import serve_raw
from pytest_kimi.testing.scriptedchunks import API_CHUNKS, Chunks


@dataclass
class Defaults:
    """Scripts for requests that bring none."""

    ttft_ms: float = 50.0
    itl_ms: float = 5.0
    tokens_per_chunk: int = 1
    reasoning_tokens: int = 0  # chat: the first N tokens stream as reasoning_content
    jitter: float = 0.0  # each request's ttft/itl is stretched by up to this fraction
    seed: int = 0
    key: str = "arrival"  # what the jitter is drawn for: arrival order, or the prompt's text


@dataclass
class State:
    defaults: Defaults
    truth: list[dict[str, Any]] = field(default_factory=list)
    gets: list[dict[str, Any]] = field(default_factory=list)  # other GETs: path, head, end


def make_script(
    body: dict[str, Any], defaults: Defaults, index: int, text: str = ""
) -> dict[str, Any]:
    """The request's script: its own, else drawn for its arrival ``index`` or, with
    ``key="prompt"``, for its ``text`` (two clients sending the same prompts in different
    orders then get the same script per prompt)."""
    params = body.get("sampling_params")
    if params is None:  # OpenAI bodies
        limit = body.get("max_completion_tokens", body.get("max_tokens", 16))
        params = {"script": body.get("script"), "max_new_tokens": limit}
    script = dict(params.get("script") or {})
    if defaults.key == "prompt":
        index = int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)
    rng = random.Random(defaults.seed * 100003 + index)
    script.setdefault("ttft_ms", defaults.ttft_ms * (1 + defaults.jitter * rng.random()))
    script.setdefault("itl_ms", defaults.itl_ms * (1 + defaults.jitter * rng.random()))
    script.setdefault("tokens_per_chunk", defaults.tokens_per_chunk)
    script.setdefault("max_new_tokens", int(params.get("max_new_tokens", 16)))
    script.setdefault("reasoning_tokens", defaults.reasoning_tokens)
    return script


class _Protocol(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.state = state
        self.buffer = b""
        self.accepted = 0.0  # the connection reached our loop
        self.first_byte = 0.0  # the request's first bytes reached our loop
        self.head_at = 0.0  # its head was parsed: the handler's entry, the script's anchor
        self.arrived = 0.0  # its body was complete
        self.head: tuple[str, str, dict[str, str], int] | None = None
        self.kernel_at: float | None = None  # set by the transport before each read
        self.kernel_first: float | None = None  # the request's first segment reached the kernel
        self.keep_alive = False  # keep-alive clients get chunked bodies on a reused connection
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.accepted = time.perf_counter()

    def between_requests(self) -> bool:
        """No request is being read: the next byte starts one (its arrival is stamped)."""
        return not self.buffer and self.head is None

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.between_requests():
            self.first_byte, self.kernel_first = now, self.kernel_at
        self.buffer += data
        if self.head is None:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            self.head_at = now  # the handler starts here, before the body is read
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
            }
            self.head = (method, path, headers, int(headers.get("content-length", "0")))
            self.buffer = rest
        method, path, headers, length = self.head
        if len(self.buffer) < length:
            return
        body, self.buffer, self.head = self.buffer[:length], b"", None
        self.arrived = now
        self.keep_alive = headers.get("connection", "").lower() != "close"
        asyncio.get_running_loop().create_task(self.handle(method, path, body))

    def _send(self, status: str, content_type: str, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        self.transport.close()

    async def handle(self, method: str, path: str, body: bytes) -> None:
        if method == "POST" and path in API_CHUNKS:
            await self.respond(API_CHUNKS[path], json.loads(body or b"{}"))
        elif path == "/truth":
            self._send("200 OK", "application/json", json.dumps(self.state.truth).encode())
        elif path == "/gets":
            self._send("200 OK", "application/json", json.dumps(self.state.gets).encode())
        elif path == "/reset":
            self.state.truth.clear()
            self.state.gets.clear()
            self._send("200 OK", "text/plain", b"ok")
        elif method == "GET":  # /get_server_info, /get_model_info, /health: stamped
            info = json.dumps({"model_path": "scripted", "is_generation": True}).encode()
            before = time.perf_counter()  # the answer cannot be read before its write began
            self._send("200 OK", "application/json", info)
            self.state.gets.append({"path": path, "head": self.head_at, "end_before": before,
                                    "end": time.perf_counter()})  # fmt: skip
        else:
            self._send("404 Not Found", "text/plain", b"not found")

    async def respond(self, api: type[Chunks], body: dict[str, Any]) -> None:
        """Stream the request's script on ``api`` (:mod:`pytest_kimi.testing.scriptedchunks`)."""
        text = api.prompt(body)
        script = make_script(body, self.state.defaults, len(self.state.truth), text)
        if not api.reasoning:  # /generate and completions have no reasoning field (0.5.9)
            script["reasoning_tokens"] = 0
        entry = self._entry(script, text)
        chunks = api(body, entry)
        await self._stream(entry, chunks.render, chunks.tail)

    def _entry(self, script: dict[str, Any], text: str) -> dict[str, Any]:
        """The request's truth record, appended to ``/truth`` at once."""
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        entry: dict[str, Any] = {
            "index": len(self.state.truth),
            "prompt_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "prompt_tokens": len(text.split()),
            "peer": list(peer) if peer else None,
            "accepted": self.accepted,
            "kernel_first": self.kernel_first,  # None on a transport without kernel stamps
            "first_byte": self.first_byte,
            "head": self.head_at,
            "received": self.arrived,
            "handler": time.perf_counter(),  # the body parsed: the script may begin
            "anchor": self.head_at,
            "script": script,
            "chunks": [],  # [written after, tokens, written before, kind, deadline]
        }
        self.state.truth.append(entry)
        return entry

    async def _stream(
        self,
        entry: dict[str, Any],
        render: Callable[[int, int, str], bytes],
        tail: Callable[[int], bytes] = lambda done: b"",
    ) -> None:
        """Write the script's chunks at their deadlines from ``entry["anchor"]``, stamping
        each write; ``render(done, n, kind)`` is a chunk's SSE bytes, ``tail(done)`` what
        goes before ``[DONE]``. A chunk never mixes reasoning and answer tokens."""
        assert self.transport is not None
        script = entry["script"]
        keep = self.keep_alive
        framing = b"Transfer-Encoding: chunked" if keep else b"Connection: close"
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + framing + b"\r\n\r\n"
        )

        async def send(data: bytes) -> None:
            """Write; return once the bytes are in the kernel (the client may read them)."""
            assert self.transport is not None
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if keep else data)
            drain = getattr(self.transport, "drain", None)
            if drain is not None:
                await drain()

        total = script["max_new_tokens"]
        reasoning = min(total, max(0, int(script.get("reasoning_tokens", 0))))
        per_chunk = max(1, int(script["tokens_per_chunk"]))
        deadline = entry["anchor"] + script["ttft_ms"] / 1000
        done = 0
        while done < total:
            kind = "reasoning" if done < reasoning else "answer"
            n = min(per_chunk, (reasoning if kind == "reasoning" else total) - done)
            delay = deadline - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            done += n
            data = render(done, n, kind)
            before = time.perf_counter()
            await send(data)
            entry["chunks"].append([time.perf_counter(), n, before, kind, deadline])
            deadline += script["itl_ms"] / 1000 * n
        entry["completion_tokens"], entry["reasoning_tokens"] = done, reasoning
        data = tail(done) + b"data: [DONE]\n\n"
        entry["end_before"] = time.perf_counter()
        await send(data)
        entry["end"] = time.perf_counter()
        if keep:
            self.transport.write(b"0\r\n\r\n")
        else:
            self.transport.close()


async def serve(host: str, port: int, defaults: Defaults) -> None:
    state = State(defaults)
    await serve_raw(lambda: _Protocol(state), host, port)


def main() -> None:
    parser = argparse.ArgumentParser(description="ground-truth streaming server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=5.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--reasoning-tokens", type=int, default=0, help="chat: leading N")
    parser.add_argument("--jitter", type=float, default=0.0, help="relative spread of scripts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--script-key", choices=("arrival", "prompt"), default="arrival",
        help="draw each jittered script for the arrival order or for the prompt",
    )  # fmt: skip
    args = parser.parse_args()
    defaults = Defaults(
        args.ttft_ms, args.itl_ms, args.tokens_per_chunk, args.reasoning_tokens, args.jitter,
        args.seed, args.script_key,
    )  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, defaults))


if __name__ == "__main__":
    main()
