"""A TCP server for the ground-truth server whose reads carry the kernel's arrival time.

asyncio's transports read with ``recv``, which drops what the kernel knows: when the bytes
reached the socket. A server whose event loop is busy streaming to others reads a request
late, and a truth that starts at that read would count the server's lateness as the
client's. So every read is a ``recvmsg`` with the kernel's arrival stamp
(:mod:`pytest_kimi.workload.kernelstamps`); the first byte of each request is read on its
own, so its stamp is the first segment's.

It offers what :class:`asyncio.Protocol` users need (``write``, ``close``,
``get_extra_info``) plus ``drain``, so the scripted server's protocol runs on it unchanged:
before each ``data_received`` the protocol's ``kernel_at`` is set to the stamp of the data's
first segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any

from pytest_kimi.workload import kernelstamps

READ_SIZE = 262144


class RawTransport(asyncio.Transport):
    """One accepted connection: reads stamped by the kernel, writes buffered when the peer
    is slow."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol) -> None:
        super().__init__()
        self.loop, self.sock, self.protocol = loop, sock, protocol
        self.pending = bytearray()
        self.closing = False
        self.flushed = asyncio.Event()
        self.flushed.set()
        self.extra = {"peername": sock.getpeername(), "socket": sock}
        protocol.connection_made(self)
        loop.add_reader(sock.fileno(), self._read)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def _read(self) -> None:
        at_start = getattr(self.protocol, "between_requests", lambda: False)()
        try:  # a request's first byte alone: its stamp is the first segment's
            data, ancillary, _, _ = self.sock.recvmsg(
                1 if at_start else READ_SIZE, kernelstamps.ANCILLARY_SIZE
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._lost()
            return
        if not data:
            self._lost()
            return
        if at_start:  # the rest that is there, in the same turn of the loop
            with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
                data += self.sock.recv(READ_SIZE)
        self.protocol.kernel_at = kernelstamps.stamp(ancillary)
        self.protocol.data_received(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or not data:
            return
        if not self.pending:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._lost()
                return
            data = data[sent:]
            if not data:
                return
            self.loop.add_writer(self.sock.fileno(), self._flush)
            self.flushed.clear()
        self.pending += data

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._lost()
            return
        del self.pending[:sent]
        if not self.pending:
            self.loop.remove_writer(self.sock.fileno())
            self.flushed.set()
            if self.closing:
                self._close_now()

    async def drain(self) -> None:
        """Until every byte written so far is in the kernel."""
        await self.flushed.wait()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if not self.pending:
            self._close_now()

    def _close_now(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
        self.flushed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.protocol.connection_lost(None)

    def _lost(self) -> None:
        self.closing = True
        self.pending.clear()
        self._close_now()


async def serve_raw(factory: Callable[[], Any], host: str, port: int) -> None:
    """Accept on ``host:port`` until cancelled; each connection gets ``factory()``."""
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # on the listener: a connection inherits it, so bytes that arrive before accept are stamped
    kernelstamps.enable(listener)
    listener.bind((host, port))
    listener.listen(1024)
    listener.setblocking(False)

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            kernelstamps.enable(sock)
            RawTransport(loop, sock, factory())

    loop.add_reader(listener.fileno(), accept)
    try:
        await asyncio.Event().wait()
    finally:
        loop.remove_reader(listener.fileno())
        listener.close()
