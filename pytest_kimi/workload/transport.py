"""An httpx transport for measurement: one fresh connection per request, stamped on arrival.

httpx's default transport (httpcore over anyio) costs ~0.3 ms of Python per received chunk on a
2-core machine; with 64 streams that queueing shows up as milliseconds of false TTFT and ITL.
This transport keeps httpx's API (requests, responses, timeouts, ``aiter_bytes``) but moves bytes
with a bare asyncio protocol: the socket's data is parsed where it arrives
(``data_received``), every body piece carries the time it arrived, and a response ends with
its connection (``Connection: close``), as ``sglang.bench_serving`` does with a new session per
request. Readers get the arrival time of the piece they hold from
``response.extensions["kimi_arrival"]`` (an :class:`Arrival`).

HTTP/1.1 only, which is what SGLang, its router and our mock speak; bodies are read by
Content-Length, chunked transfer coding, or until close.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx


@dataclass
class Arrival:
    """When the body piece most recently handed to the reader arrived."""

    time: float = 0.0


class ProtocolError(httpx.RemoteProtocolError):
    """The server's response is not valid HTTP/1.1."""


class _Connection(asyncio.Protocol):
    """Parses one response; body pieces go to a queue with their arrival time."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.transport: asyncio.Transport | None = None
        self.head = asyncio.get_running_loop().create_future()
        self.pieces: asyncio.Queue[tuple[float, bytes] | BaseException | None] = asyncio.Queue()
        self.buffer = b""
        self.mode = "head"  # head -> length | chunked | close -> done
        self.remaining = 0

    # -- asyncio callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = self.clock()
        self.buffer += data
        try:
            self._parse(now)
        except ProtocolError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.mode == "close":
            self.mode = "done"
            self.pieces.put_nowait(None)
        elif self.mode != "done":
            self._fail(httpx.RemoteProtocolError("server closed the connection mid-response"))

    # -- parsing ---------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(exc)
        self.pieces.put_nowait(exc)
        self.mode = "done"
        if self.transport is not None:
            self.transport.close()

    def _parse(self, now: float) -> None:
        if self.mode == "head":
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > 65536:
                    raise ProtocolError("response head larger than 64 KiB")
                return
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            status, headers = _parse_head(head)
            names = {k.lower(): v for k, v in headers}
            if names.get(b"transfer-encoding", b"").lower() == b"chunked":
                self.mode = "chunked"
            elif b"content-length" in names:
                self.mode, self.remaining = "length", int(names[b"content-length"])
            else:
                self.mode = "close"
            self.head.set_result((status, headers))
        if self.mode == "length":
            take = self.buffer[: self.remaining]
            self.buffer = self.buffer[len(take) :]
            self.remaining -= len(take)
            if take:
                self.pieces.put_nowait((now, take))
            if self.remaining == 0:
                self._finish()
        elif self.mode == "close":
            if self.buffer:
                self.pieces.put_nowait((now, self.buffer))
                self.buffer = b""
        elif self.mode == "chunked":
            self._parse_chunks(now)

    def _parse_chunks(self, now: float) -> None:
        out = []
        while True:
            if self.remaining == 0:
                line_end = self.buffer.find(b"\r\n")
                if line_end < 0:
                    break
                size_text = self.buffer[:line_end].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                if size == 0:
                    if out:
                        self.pieces.put_nowait((now, b"".join(out)))
                    self._finish()
                    return
                self.buffer = self.buffer[line_end + 2 :]
                self.remaining = size + 2  # data + CRLF
            take = self.buffer[: self.remaining]
            self.buffer = self.buffer[len(take) :]
            self.remaining -= len(take)
            data = take if self.remaining >= 2 else take[: len(take) - (2 - self.remaining)]
            if data:
                out.append(data)
            if self.remaining > 0:
                break
        if out:
            self.pieces.put_nowait((now, b"".join(out)))

    def _finish(self) -> None:
        self.mode = "done"
        self.pieces.put_nowait(None)
        if self.transport is not None:
            self.transport.close()


def _parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers.append((name.strip(), value.strip()))
    return int(parts[1]), headers


class _Body(httpx.AsyncByteStream):
    def __init__(self, conn: _Connection, arrival: Arrival) -> None:
        self.conn, self.arrival = conn, arrival

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.conn.pieces.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            self.arrival.time, data = item
            yield data

    async def aclose(self) -> None:
        if self.conn.transport is not None:
            self.conn.transport.close()


class MeasuringTransport(httpx.AsyncBaseTransport):
    """httpx transport: new connection per request, body pieces stamped on arrival."""

    def __init__(
        self, connect_timeout: float = 30.0, clock: Callable[[], float] = time.perf_counter
    ):
        self.connect_timeout, self.clock = connect_timeout, clock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"MeasuringTransport speaks plain http, not {url.scheme}"
            )
        trace = request.extensions.get("trace")
        loop = asyncio.get_running_loop()
        port = url.port or 80
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self.clock), url.host, port),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise httpx.ConnectError(f"cannot connect to {url.host}:{port}: {exc}") from exc
        body = await request.aread()
        target = url.raw_path.decode("ascii")
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"connection"]
        lines = [f"{request.method} {target} HTTP/1.1".encode()]
        lines += [k + b": " + v for k, v in headers]
        lines += [b"Connection: close"]
        if body and b"content-length" not in {k.lower() for k, _ in headers}:
            lines.append(f"Content-Length: {len(body)}".encode())
        if trace is not None:
            await trace("http11.send_request_headers.started", {"request": request})
        # the send instant on CLOCK_MONOTONIC: a ground-truth server on this machine anchors
        # its script there; any other server ignores an unknown header
        lines.append(f"X-Kimi-Sent-At: {self.clock():.9f}".encode())
        assert conn.transport is not None
        conn.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        try:
            status, response_headers = await conn.head
        except BaseException:
            conn.transport.close()
            raise
        arrival = Arrival()
        return httpx.Response(
            status,
            headers=response_headers,
            stream=_Body(conn, arrival),
            extensions={"kimi_arrival": arrival, "http_version": b"HTTP/1.1"},
        )
