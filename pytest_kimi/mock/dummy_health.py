"""The health server of a mock replica's ranks >= 1, from the standard library alone.

SGLang 0.5.9's ranks >= 1 serve ``launch_dummy_health_check_server`` once their node's
schedulers are up: a FastAPI app under uvicorn with ``GET /ping``, ``/health`` and
``/health_generate``, each an empty 200 (FastAPI answers other paths 404 and other methods on
these 405, with its JSON ``detail``; uvicorn keeps an idle connection 5 s). This answers the
same over asyncio streams, so these ranks never import aiohttp: with 6 of a layout's 8 mock
processes being such ranks, that is most of a local bring-up's start-up CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging

log = logging.getLogger("sglang.mock")

PATHS = ("/ping", "/health", "/health_generate")
KEEP_ALIVE_S = 5.0  # uvicorn's timeout_keep_alive in SGLang's dummy server
MAX_HEAD = 65536


def answer(method: str, path: str) -> tuple[int, str, bytes]:
    """Status, reason and body for a request line (FastAPI's routing of the dummy app)."""
    if path not in PATHS:
        return 404, "Not Found", b'{"detail":"Not Found"}'
    if method != "GET":
        return 405, "Method Not Allowed", b'{"detail":"Method Not Allowed"}'
    return 200, "OK", b""


def _response(status: int, reason: str, body: bytes, close: bool) -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", f"date: {email.utils.formatdate(usegmt=True)}",
            "server: uvicorn", f"content-length: {len(body)}"]  # fmt: skip
    if body:
        head.append("content-type: application/json")
    if status == 405:
        head.append("allow: GET")
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Connections:
    """Open connections, so that closing the server closes them too (no stray keep-alives)."""

    def __init__(self) -> None:
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):  # fmt: skip
            pass  # a line past the reader's limit (ValueError), a peer gone: hang up
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; whether the connection stays open for another."""
        try:
            line = await asyncio.wait_for(reader.readline(), KEEP_ALIVE_S)
        except asyncio.TimeoutError:  # (Python 3.10's wait_for raises this one, not TimeoutError)
            return False
        if not line:
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            log.warning("Invalid HTTP request received.")  # uvicorn's line (HTTP/2 probes too)
            return False
        method, target, version = parts
        # h11 (uvicorn's) closes after an HTTP/1.0 request whatever it asks
        close, length, size = version == "HTTP/1.0", 0, len(line)
        while True:
            header = await reader.readline()
            size += len(header)
            if size > MAX_HEAD:
                writer.write(_response(431, "Request Header Fields Too Large", b"", True))
                await writer.drain()
                return False
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length" and value.isdigit():
                length = int(value)
            elif name == "connection" and "close" in (t.strip() for t in value.split(",")):
                close = True
            elif name == "transfer-encoding":
                close = True  # a chunked body is not read: answer, then hang up
        if length:
            await reader.readexactly(length)
        status, reason, body = answer(method, target.split("?", 1)[0])
        writer.write(_response(status, reason, body, close))
        await writer.drain()
        return not close

    def close_all(self) -> None:
        for writer in list(self.writers):
            writer.close()


async def serve_dummy_health(host: str, port: int) -> DummyHealthServer:
    """Listen on ``host:port``; :meth:`DummyHealthServer.close` stops it and its connections."""
    connections = _Connections()
    server = await asyncio.start_server(connections.handle, host, port)
    return DummyHealthServer(server, connections)


class DummyHealthServer:
    """A started dummy health server."""

    def __init__(self, server: asyncio.Server, connections: _Connections) -> None:
        self.server, self.connections = server, connections

    async def close(self) -> None:
        self.server.close()
        self.connections.close_all()
        with contextlib.suppress(Exception):
            await self.server.wait_closed()
