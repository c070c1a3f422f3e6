"""A decode server's side of disaggregation (SGLang's ``srt/disaggregation/decode.py``).

A request's decode copy waits in the *prealloc queue* until the server has room for its KV
cache, tells the prefill so, and waits in the *transfer queue* until the KV has landed; then a
"prebuilt" step streams its first token and it decodes with the running batch. How the two
sides work together, and what is not modelled: :mod:`pytest_kimi.mock.disagg`.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

from pytest_kimi.mock.bootstrap import Line, open_line
from pytest_kimi.mock.disagg import Bootstrap, hold_for_notice
from pytest_kimi.mock.engine import Engine, Stream
from pytest_kimi.mock.kvlink import Link, Span, side_bandwidth
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.mock.speculative import Drafts
from pytest_kimi.mock.stagelatency import StageLatencies


@dataclass
class _DecodeRoom:
    rid: str
    prompt: int
    max_new: int
    arrived: float
    boot: Bootstrap
    drafts: Drafts | None = None  # speculative decoding on this side: the prompt's acceptance
    line: Line | None = None
    ready: float | None = None  # preallocated (cluster time)
    landed: float | None = None


class DecodeSide:
    """A decode server's queues: prealloc, transfer, then the running batch."""

    def __init__(
        self, engine: Engine, profile: Profile, *, nodes: int, bootstrap_port: int = 8998,
        tp: int = 1,
    ) -> None:  # fmt: skip
        self.engine, self.profile, self.bootstrap_port = engine, profile, bootstrap_port
        self.tp = tp  # said in each notice: the prefill slices the KV for it
        self.observed: list[tuple[str, float]] = []  # (histogram, value) for the next scrape
        self.queue_times = False  # 0.5.10 and later: decode_waiting is a queue_time sample too
        self.ingress = Link(side_bandwidth(profile, nodes))
        self.stages = StageLatencies()
        self.rooms: dict[int, _DecodeRoom] = {}
        self.by_rid: dict[str, int] = {}
        self.prealloc: collections.deque[int] = collections.deque()  # rooms waiting for room
        self.occupied: set[str] = set()  # requests holding a slot: preallocated, not finished
        self.lines: dict[tuple[str, int | None], Line] = {}
        self.listeners: list[asyncio.Task[None]] = []
        engine.on_finish.append(self._finished)

    @property
    def capacity(self) -> int:
        return self.engine.sim.max_running

    async def submit(
        self, rid: str, prompt: int, max_new: int, boot: Bootstrap, drafts: Drafts | None = None
    ) -> Stream:
        """A request's decode copy arrives: preallocate (or queue), tell the prefill."""
        now = self.engine.timebase.now()
        if boot.fake:  # no KV to wait for: decode at once
            self.occupied.add(rid)
            return self.engine.submit_at(rid, prompt, max_new, now, prebuilt=True, drafts=drafts)
        self.stages.observe("decode_prepare", 0.0)
        stream = self.engine.expect(rid, prompt, max_new)
        room = _DecodeRoom(rid, prompt, max_new, now, boot, drafts)
        self.rooms[boot.room], self.by_rid[rid] = room, boot.room
        room.line = await self._line(boot)
        if boot.room not in self.rooms:  # aborted while connecting
            return stream
        if len(self.occupied) < self.capacity and not self.prealloc:
            self._preallocate(boot.room, max(now, self.engine.timebase.now()))
        else:
            self.prealloc.append(boot.room)
            hold_for_notice(self.engine)
            room.line.send({"room": boot.room, "at": None, "tp": self.tp})
        return stream

    def forget(self, rid: str) -> None:
        room = self.by_rid.pop(rid, None)
        if room is not None:
            self.rooms.pop(room, None)
            if room in self.prealloc:
                self.prealloc.remove(room)
        self._finished(rid)

    def hear(self, line: Line, message: dict[str, Any]) -> None:
        """The prefill's notice: how each chunk of a room's KV went over the network."""
        shared = self.engine.shared
        if shared is not None:
            shared.arrive(request=False)
        room = self.rooms.get(int(message["room"]))
        if room is None or room.ready is None:
            return
        mine = self.engine.timebase.from_common
        spans = [Span(mine(float(a)), mine(float(b)), float(n)) for a, b, n in message["spans"]]
        landed = max([room.ready, *(self.ingress.receive(s).end for s in spans)])
        room.landed = landed
        self.stages.observe("decode_transferred", landed - room.ready)
        self.engine.submit_at(room.rid, room.prompt, room.max_new, landed, prebuilt=True,
                              drafts=room.drafts)  # fmt: skip

    async def close(self) -> None:
        for line in self.lines.values():
            line.writer.close()
        for task in self.listeners:
            task.cancel()

    # -- internals --------------------------------------------------------------------------
    async def _line(self, boot: Bootstrap) -> Line:
        key = (boot.host, boot.port)
        if key in self.lines and self.lines[key].closed:  # the prefill went away: start over
            del self.lines[key]
        if key not in self.lines:
            # no port from the router: SGLang's scheduler uses its own bootstrap port flag
            port = boot.port if boot.port is not None else self.bootstrap_port
            line, task = await open_line(boot.host, port, self.hear)
            if key in self.lines:  # another request connected meanwhile
                line.writer.close()
                task.cancel()
            else:
                self.lines[key] = line
                self.listeners.append(task)
        return self.lines[key]

    def _preallocate(self, room_id: int, at: float) -> None:
        room = self.rooms[room_id]
        room.ready = at
        self.occupied.add(room.rid)
        self.stages.observe("decode_bootstrap", at - room.arrived)
        if room.line is not None:
            hold_for_notice(self.engine)
            room.line.send({"room": room_id, "at": self.engine.timebase.to_common(at),
                            "tp": self.tp})  # fmt: skip

    def _finished(self, rid: str) -> None:
        """A slot is free again: the prealloc queue's first request takes it."""
        if rid not in self.occupied:
            return
        self.occupied.discard(rid)
        room_id = self.by_rid.pop(rid, None)
        room = self.rooms.pop(room_id, None) if room_id is not None else None
        req = self.engine.sim.requests.get(rid)
        landed = room.landed if room is not None else None
        if landed is not None and req is not None and req.admitted_at is not None:
            self.stages.observe("decode_waiting", req.admitted_at - landed)
            if self.queue_times:
                self.observed.append(("sglang:queue_time_seconds", req.admitted_at - landed))
        while self.prealloc and len(self.occupied) < self.capacity:
            self._preallocate(self.prealloc.popleft(), self.engine.sim.now)

    # -- gauges -----------------------------------------------------------------------------
    def gauges(self, now: float) -> dict[str, float]:
        moving = sum(1 for r in self.rooms.values()
                     if r.ready is not None and (r.landed is None or r.landed > now))  # fmt: skip
        return {"num_decode_prealloc_queue_reqs": len(self.prealloc),
                "num_decode_transfer_queue_reqs": moving}  # fmt: skip
