"""How a decode server finds its prefill server, and the line the mock's KV notices travel on.

SGLang 0.5.9 (``srt/disaggregation/common/conn.py``, ``CommonKVBootstrapServer``): a prefill
server runs a small HTTP server on ``--disaggregation-bootstrap-port`` (node 0's host), where
its ranks register (``PUT /route``) and a decode server asks for them (``GET /route``):

* ``GET /health``: ``OK``;
* ``GET /route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1``: the prefill's sizes
  (``prefill_attn_tp_size``, ``prefill_dp_size``, ``prefill_pp_size``, ``prefill_page_size``);
* ``GET /route?engine_rank=E&target_dp_group=G&target_pp_rank=P``: that rank's
  ``{"rank_ip", "rank_port"}``, where the decode then talks to it (ZMQ) while the transfer
  engine moves the KV cache itself (RDMA);
* a missing parameter: 400; another method: 405.

The mock serves the same routes. What real SGLang does over ZMQ and RDMA is, in the mock,
one TCP connection per (decode, prefill) pair to the ``rank_port`` that ``/route`` names,
carrying JSON lines (:class:`Line`): the decode says when it has room for a request's KV
(``{"room": R, "at": T}``, or ``"at": null`` while it has none), the prefill says when each
chunk of it went over the network (``{"room": R, "spans": [[start, end, bytes], ...]}``).
Nothing of the product reads this line; it is how two mock processes share what the transfer
engine would do between them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

log = logging.getLogger("sglang.mock")

ROUTE_PARAMS = ("engine_rank", "target_dp_group", "target_pp_rank")
LINE_LIMIT = 1 << 22  # bytes a notice may take (a chunk is ~40 bytes of it)


def bootstrap_app(info: dict[str, int], rank_ip: str, rank_port: int) -> web.Application:
    """The prefill's bootstrap server: its sizes, and every rank at ``rank_ip:rank_port``
    (the mock's ranks share rank 0's line)."""
    registered: list[dict[str, Any]] = []

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def route(request: web.Request) -> web.Response:
        if request.method == "PUT":
            registered.append(await request.json())
            return web.Response(text="OK")
        if request.method != "GET":
            return web.Response(status=405, text="Method not allowed")
        try:
            rank, group, pp = (int(request.query[name]) for name in ROUTE_PARAMS)
        except (KeyError, ValueError):
            return web.Response(status=400, text="Missing inputs for bootstrap server.")
        if rank == -1 and group == -1 and pp == -1:
            return web.json_response(info)
        if rank >= info["prefill_attn_tp_size"] or pp >= info["prefill_pp_size"] or group != 0:
            return web.Response(status=404, text="Bootstrap info not Found")
        return web.json_response({"rank_ip": rank_ip, "rank_port": rank_port})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_route("*", "/route", route)
    return app


class Line:
    """One end of a (decode, prefill) pair's connection: JSON messages, one per line."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.closed = False  # the other end went away: open a new line

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message (synchronous: the scheduler loop may call it mid-step)."""
        self.writer.write(json.dumps(message).encode() + b"\n")

    async def listen(self, hear: Callable[[Line, dict[str, Any]], None]) -> None:
        """Hand every message to ``hear`` until the other end goes away."""
        self.closed = False
        try:
            while line := await self.reader.readline():
                try:
                    hear(self, json.loads(line))
                except Exception:  # a notice this side cannot take: say so, keep listening
                    log.exception("KV notice %r could not be taken in", line[:200])
        finally:
            self.closed = True
            self.writer.close()


async def serve_lines(
    host: str, hear: Callable[[Line, dict[str, Any]], None]
) -> asyncio.Server:
    """The prefill's end: accept decode servers on a free port of ``host``."""

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await Line(reader, writer).listen(hear)

    return await asyncio.start_server(accepted, host, 0, limit=LINE_LIMIT)


async def open_line(
    host: str, port: int, hear: Callable[[Line, dict[str, Any]], None], timeout_s: float = 30.0
) -> tuple[Line, asyncio.Task[None]]:
    """The decode's end: ask ``host:port`` (a bootstrap server) where its rank 0 listens, as
    SGLang's decode does, and connect there."""
    base = f"http://{host}:{port}/route"
    async with ClientSession(timeout=ClientTimeout(total=timeout_s)) as session:
        query = dict.fromkeys(ROUTE_PARAMS, "-1")
        async with session.get(base, params=query) as response:
            response.raise_for_status()
            info = await response.json()
        query = dict.fromkeys(ROUTE_PARAMS, "0")
        async with session.get(base, params=query) as response:
            response.raise_for_status()
            rank = await response.json()
    log.info("bootstrap %s:%d: prefill %s, rank 0 at %s:%s", host, port, info,
             rank["rank_ip"], rank["rank_port"])  # fmt: skip
    reader, writer = await asyncio.open_connection(rank["rank_ip"], int(rank["rank_port"]),
                                                   limit=LINE_LIMIT)  # fmt: skip
    line = Line(reader, writer)
    return line, asyncio.create_task(line.listen(hear))
