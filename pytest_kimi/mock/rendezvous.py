"""Multi-node start-up: ranks 1..n-1 join rank 0 over TCP at ``--dist-init-addr``.

A real TCP rendezvous, like torch.distributed's store: rank 0 listens, every other rank
connects and says who it is. Rank 0 serves HTTP only once all have joined; if some do not
join in time it names them and the process exits non-zero. The connections stay open for
the life of the replica: when one side goes away, the other notices and exits, so a dead
node takes its replica down (as an NCCL failure would) instead of leaving orphans.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

log = logging.getLogger("sglang.mock")


class RendezvousError(RuntimeError):
    """Some ranks did not join, or rank 0 could not be reached."""


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise RendezvousError(f"--dist-init-addr {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class Rank0:
    """Rank 0's side: accepts joins and watches the peers."""

    def __init__(self, addr: str, nnodes: int) -> None:
        self.host, self.port = split_addr(addr)
        self.nnodes = nnodes
        self.joined: dict[int, str] = {}
        self.peers: dict[int, asyncio.StreamWriter] = {}
        self.all_joined = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost_rank: int | None = None
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._on_join, self.host, self.port)
        log.info("Rendezvous listening on %s:%d for %d node(s)", self.host, self.port, self.nnodes)
        if self.nnodes <= 1:
            self.all_joined.set()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.all_joined.wait(), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(range(1, self.nnodes)) - set(self.joined))
            raise RendezvousError(
                f"node rank(s) {', '.join(map(str, missing))} of {self.nnodes} did not join "
                f"{self.host}:{self.port} within {timeout:g}s"
            ) from None

    async def _on_join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = json.loads(await asyncio.wait_for(reader.readline(), 10))
            rank = int(hello["rank"])
        except (asyncio.TimeoutError, ValueError, KeyError, TypeError):
            writer.close()
            return
        self.joined[rank] = str(hello.get("host", "?"))
        self.peers[rank] = writer
        log.info(
            "Node rank %d (%s) joined (%d/%d)",
            rank,
            self.joined[rank],
            len(self.joined) + 1,
            self.nnodes,
        )
        writer.write(b'{"ok": true}\n')
        await writer.drain()
        if len(self.joined) >= self.nnodes - 1:
            self.all_joined.set()
        await reader.read()  # returns when the peer goes away
        if not self.lost.is_set():
            self.lost_rank = rank
            self.lost.set()

    def broadcast(self, message: dict) -> None:
        """Send one JSON line to every joined rank (best effort: a lost peer is noticed by
        its reader)."""
        line = json.dumps(message).encode() + b"\n"
        for writer in self.peers.values():
            if not writer.is_closing():
                writer.write(line)

    async def close(self) -> None:
        for writer in self.peers.values():
            writer.close()
        if self.server is not None:
            self.server.close()


async def join(
    addr: str, rank: int, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Rank >= 1: connect to rank 0 (retrying until ``timeout``); keep both ends open."""
    host, port = split_addr(addr)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            break
        except OSError as exc:
            if loop.time() > deadline:
                raise RendezvousError(
                    f"rank 0 at {host}:{port} unreachable for {timeout:g}s: {exc}"
                ) from None
            await asyncio.sleep(0.05)
    hello = {"rank": rank, "host": socket.gethostname()}
    writer.write(json.dumps(hello).encode() + b"\n")
    await writer.drain()
    await asyncio.wait_for(reader.readline(), timeout)
    log.info("Joined rank 0 at %s:%d as node rank %d", host, port, rank)
    return reader, writer


async def follow(reader: asyncio.StreamReader, on_message) -> None:
    """Read rank 0's JSON lines (its load) until the link closes: returns when rank 0 is gone."""
    while True:
        try:
            line = await reader.readline()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        if not line:
            return
        try:
            on_message(json.loads(line))
        except ValueError:
            continue
