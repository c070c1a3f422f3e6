"""An httpx transport for measurement: one fresh connection per request, stamped on arrival.

httpx's default transport (httpcore over anyio) costs ~0.3 ms of Python per received chunk on a
2-core machine; with 64 streams that queueing shows up as milliseconds of false TTFT and ITL.
This transport keeps httpx's API (requests, responses, timeouts, ``aiter_bytes``) but moves bytes
with a bare asyncio protocol: the socket's data is parsed where it arrives
(``data_received``), every body piece carries the time it arrived, and a response ends with
its connection (``Connection: close``), as ``sglang.bench_serving`` does with a new session per
request. Readers get the arrival time of the piece they hold from
``response.extensions["kimi_arrival"]`` (an :class:`Arrival`). A request may carry a
:class:`Phases` (``extensions["kimi_phases"]``): the transport stamps when its connection
opened and when its last byte was in the kernel, so a request's time before the server saw
it can be split into connecting and sending.

The transport sends nothing a real client would not: the server learns nothing of our clock.

HTTP/1.1 only, which is what SGLang, its router and our mock speak; bodies are read by
Content-Length, chunked transfer coding, or until close.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from pytest_kimi.workload import kernelstamps

READ_SIZE = 262144


@dataclass
class Arrival:
    """When the body piece most recently handed to the reader arrived."""

    time: float = 0.0


@dataclass
class Phases:
    """When a request's connecting began, its connection opened and its last byte was in
    the kernel."""

    connecting: float | None = None
    connected: float | None = None
    sent: float | None = None


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

    def data_received(self, data: bytes, at: float | None = None) -> None:
        """``at``: when the kernel received ``data`` (its last segment), if it said."""
        now = self.clock() if at is None else at
        self.buffer += data
        try:
            self._parse(now)
        except ProtocolError as exc:
            self._fail(exc)
        except ValueError as exc:  # a head field we cannot read (Content-Length: x)
            self._fail(ProtocolError(f"bad response: {exc}"))

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


class _Reader:
    """Reads a connection into its :class:`_Connection` with the kernel's arrival stamps
    (:mod:`~pytest_kimi.workload.kernelstamps`), so a chunk is timed when it arrived, not
    when our event loop got to it. Exact while the loop reads each chunk before the stream's
    next one arrives: the kernel merges segments that wait in its queue and keeps the later
    stamp, so a loop late by more than the gap between two chunks stamps the first with the
    second's arrival (never earlier than it arrived). Stands in for asyncio's transport
    (``close``, ``get_extra_info``)."""

    def __init__(self, sock: socket.socket, conn: _Connection) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock, self.conn, self.closed = sock, conn, False
        conn.connection_made(self)  # type: ignore[arg-type]
        self.loop.add_reader(sock.fileno(), self._read)

    def _read(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(READ_SIZE, kernelstamps.ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end(exc)
            return
        if not data:
            self._end(None)
            return
        self.conn.data_received(data, kernelstamps.stamp(ancillary))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"socket": self.sock}.get(name, default)

    def close(self) -> None:
        self._end(None)

    def _end(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.conn.connection_lost(exc)


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
        self,
        connect_timeout: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
        *,
        kernel_stamps: bool = False,
    ):
        """``kernel_stamps``: stamp arrivals with the kernel's receive times (only when
        ``clock`` is ``time.perf_counter``: those are on its clock)."""
        self.connect_timeout, self.clock, self.kernel_stamps = connect_timeout, clock, kernel_stamps
        self._addresses: dict[tuple[str, int], list[tuple[int, tuple]]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"MeasuringTransport speaks plain http, not {url.scheme}"
            )
        trace = request.extensions.get("trace")
        phases: Phases = request.extensions.get("kimi_phases") or Phases()
        loop = asyncio.get_running_loop()
        port = url.port or 80
        where = f"{url.host}:{port}"
        message = _message(request, await request.aread())  # our work: before the clock
        addresses = await self._addresses_of(url.host, port)
        at_turn = request.extensions.get("kimi_at_turn")
        if at_turn is not None:  # prepared ahead: the request's instant (an open loop's)
            await at_turn()
        phases.connecting = self.clock()
        sock = await self._connect(addresses, (url.host, port), where)
        phases.connected = self.clock()
        conn: _Connection | None = None
        try:
            if trace is not None:
                await trace("http11.send_request_headers.started", {"request": request})
            try:  # returns at once when the kernel took it all (loopback, a near peer)
                await loop.sock_sendall(sock, message)
            except OSError as exc:
                raise httpx.WriteError(f"sending the request to {where}: {exc}") from exc
            phases.sent = self.clock()
            conn = _Connection(self.clock)
            if self.kernel_stamps and kernelstamps.enable(sock):
                _Reader(sock, conn)
            else:
                await loop.create_connection(lambda: conn, sock=sock)
            status, response_headers = await conn.head
        except BaseException:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            else:
                sock.close()
            raise
        arrival = Arrival()
        return httpx.Response(
            status,
            headers=response_headers,
            stream=_Body(conn, arrival),
            extensions={"kimi_arrival": arrival, "http_version": b"HTTP/1.1"},
        )

    async def resolve(self, url: str) -> None:
        """Look ``url``'s host up now, once for the client: not in the first request's time
        (the first lookup starts the event loop's thread pool: milliseconds)."""
        parsed = httpx.URL(url)
        await self._addresses_of(parsed.host, parsed.port or 80)

    async def _addresses_of(self, host: str, port: int) -> list[tuple[int, tuple]]:
        """Where ``host:port`` may be, resolved once per client (a name lookup is the
        client's work, not the request's time); the one that last answered first."""
        key = (host, port)
        if key not in self._addresses:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from exc
            self._addresses[key] = [(family, address) for family, _, _, _, address in infos]
        return self._addresses[key]

    async def _connect(
        self, addresses: list[tuple[int, tuple]], key: tuple[str, int], where: str
    ) -> socket.socket:
        """A connected non-blocking socket to the first of ``addresses`` that answers (it is
        tried first from then on). Nothing yields to the event loop while a connection opens
        at once (loopback, a near peer): the request's time holds the kernel's handshake,
        never other streams' turns."""
        problems = []
        for family, address in list(addresses):
            try:
                sock = await self._connect_one(family, address)
            except (OSError, TimeoutError) as exc:
                problems.append(f"{address[0]}: {exc}")
                continue
            if addresses[0] != (family, address):
                self._addresses[key] = [(family, address)] + [
                    a for a in addresses if a != (family, address)
                ]
            return sock
        raise httpx.ConnectError(f"cannot connect to {where}: {'; '.join(problems)}")

    async def _connect_one(self, family: int, address: tuple) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex(address)
            if code == errno.EINPROGRESS and not _writable_now(sock):
                await asyncio.wait_for(_writable(sock), self.connect_timeout)
            elif code not in (0, errno.EINPROGRESS):
                raise OSError(code, os.strerror(code))
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, os.strerror(code))
        except BaseException:
            sock.close()
            raise
        return sock


def _writable_now(sock: socket.socket) -> bool:
    """Whether ``sock`` is writable this instant (``poll``: no limit on descriptor numbers)."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(0))


async def _writable(sock: socket.socket) -> None:
    """Until ``sock`` is writable (its connection opened, or failed)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_writer(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_writer(sock.fileno())


def _message(request: httpx.Request, body: bytes) -> bytes:
    """The request's bytes on the wire: HTTP/1.1, ``Connection: close``."""
    target = request.url.raw_path.decode("ascii")
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"connection"]
    lines = [f"{request.method} {target} HTTP/1.1".encode()]
    lines += [k + b": " + v for k, v in headers]
    lines += [b"Connection: close"]
    if body and b"content-length" not in {k.lower() for k, _ in headers}:
        lines.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
