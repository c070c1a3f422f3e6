"""Prefill/decode disaggregation in the mock, as SGLang 0.5.9 does it (``--disaggregation-mode``).

The router (``--pd-disaggregation``) sends the same request to a prefill and a decode server
at once, with ``bootstrap_host``/``bootstrap_port`` (the prefill's bootstrap server) and a
random ``bootstrap_room`` that pairs the two copies. Then, per ``srt/disaggregation/``:

* **decode** (``decode.py``): the request waits in the *prealloc queue* until the server has
  room for its KV cache, tells the prefill so (the room's KV indices), and waits in the
  *transfer queue* until the KV has landed; then a "prebuilt" step (no forward pass) streams
  its first token, the one the prefill produced, and it decodes with the running batch.
* **prefill** (``prefill.py``): the request waits in the *bootstrap queue* until its decode
  server has room for it (so a full decode side holds prefills back), is prefilled with one
  token to make (``max_new_tokens`` 1), sends each chunk's KV as the chunk is done, and waits
  in the *inflight queue* until the transfer is done.

Here each side is a :class:`PrefillSide` or :class:`DecodeSide` beside the replica's
:class:`~pytest_kimi.mock.engine.Engine`; what the transfer costs is
:mod:`pytest_kimi.mock.kvlink`, how the two find each other :mod:`pytest_kimi.mock.bootstrap`.
A request with SGLang's fake bootstrap host (``2.2.2.2``: warm-ups, health checks) moves no KV:
the prefill just prefills it, the decode decodes it as if its KV were there.

Times in the notices are on the shared clock where there is one; otherwise on the wall clock
both processes read (:meth:`Engine.to_common`), since each counts cluster time from its own
start. On a shared clock (a local run) each notice between the two sides holds the clock until the
other side takes it in, as a request on its way to an engine does; and the prefill does not let
the clock pass a request's arrival until its decode side has said whether it has room, so
neither side's wall-time latency turns into cluster time.

The stages SGLang's ``sglang:per_stage_req_latency_seconds`` histogram observes (each from the
previous stage's mark) are observed here on cluster time: ``prefill_prepare``,
``prefill_bootstrap``, ``prefill_waiting`` (once per chunk), ``prefill_forward``,
``prefill_transfer_kv_cache``; ``decode_prepare``, ``decode_bootstrap``, ``decode_transferred``,
``decode_waiting``. Not modelled: KV capacity in tokens (the decode side's room is
``max_running_requests`` requests), bootstrap and transfer time-outs, failures and retries
(their counters stay 0), and the prefill's response waiting for its transfer (the router
discards that body; it is answered when the prompt is prefilled).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_kimi.mock.bootstrap import Line, open_line
from pytest_kimi.mock.engine import Engine, Stream
from pytest_kimi.mock.kvlink import Link, Span, kv_bytes, side_bandwidth
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.mock.scheduler import SimRequest
from pytest_kimi.mock.speculative import Drafts
from pytest_kimi.workload.sharedclock import HOLD_STALL_S, INF

log = logging.getLogger("sglang.mock")

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's disaggregation/utils.py: no KV moves
# SGLang's per-stage histogram: exponential_buckets(start=0.001, width=1.62, length=30)
STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))


class BootstrapError(ValueError):
    """A disaggregated request without what pairs its two copies."""


@dataclass(frozen=True)
class Bootstrap:
    """A request's pairing, as the router injects it."""

    host: str
    port: int | None
    room: int

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST

    @classmethod
    def of(cls, body: dict[str, Any]) -> Bootstrap:
        host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port",
                                                  "bootstrap_room"))  # fmt: skip
        if not isinstance(host, str) or not host:
            raise BootstrapError("bootstrap_host is required in disaggregation mode")
        if isinstance(room, bool) or not isinstance(room, int):
            raise BootstrapError("bootstrap_room must be an integer in disaggregation mode")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
            raise BootstrapError("bootstrap_port must be an integer or null")
        return cls(host, port, room)


class StageLatencies:
    """``sglang:per_stage_req_latency_seconds``: one histogram per stage (cluster seconds)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = collections.defaultdict(float)

    def observe(self, stage: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        counts = self.counts.setdefault(stage, [0] * (len(STAGE_BUCKETS) + 1))
        index = next((i for i, b in enumerate(STAGE_BUCKETS) if seconds <= b), len(STAGE_BUCKETS))
        counts[index] += 1
        self.sums[stage] += seconds

    def lines(self, labels: str) -> list[str]:
        """Prometheus text: cumulative ``_bucket`` lines, ``_sum`` and ``_count`` per stage."""
        name = "sglang:per_stage_req_latency_seconds"
        out = [f"# HELP {name} The latency of each stage of requests.",
               f"# TYPE {name} histogram"]  # fmt: skip
        inner = labels.strip("{}")
        for stage, counts in self.counts.items():
            tag = f'{inner},stage="{stage}"'
            total = 0
            for bound, n in zip([*STAGE_BUCKETS, INF], counts, strict=True):
                total += n
                le = "+Inf" if bound == INF else repr(float(bound))
                out.append(f'{name}_bucket{{{tag},le="{le}"}} {float(total)}')
            out.append(f"{name}_sum{{{tag}}} {self.sums[stage]}")
            out.append(f"{name}_count{{{tag}}} {float(total)}")
        return out


def _observe_chunks(stages: StageLatencies, mark: float, chunks: list[tuple[float, float]],
                    last_done: float) -> float:  # fmt: skip
    """``prefill_waiting`` per chunk (from the last mark to the chunk's start) and
    ``prefill_forward`` (the last chunk's start to its end); returns the new mark."""
    for started, _ in chunks:
        stages.observe("prefill_waiting", started - mark)
        mark = started
    stages.observe("prefill_forward", last_done - mark)
    return last_done


def _observe_chunks_traced(stages: StageLatencies, chunks: list[tuple[float, float]],
                           last_done: float) -> None:  # fmt: skip
    """0.5.10 and later: ``chunked_prefill`` per chunk before the last (from the previous
    chunk's end, the first from its start) and ``prefill_forward`` over the whole prefill (the
    first chunk's start to the last one's end); the waits between are only traced."""
    mark = chunks[0][0]
    for _, done in chunks[:-1]:
        stages.observe("chunked_prefill", done - mark)
        mark = done
    stages.observe("prefill_forward", last_done - chunks[0][0])


@dataclass
class _PrefillRoom:
    rid: str
    prompt: int
    arrived: float
    answer_by: float  # wall time: after it, a silent decode side no longer stops the clock
    line: Line | None = None
    answered: bool = False  # the decode side said whether it has room
    ready: float | None = None  # bootstrapped (cluster time)
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (start, done)
    spans: list[Span] = field(default_factory=list)
    decode_tp: int | None = None  # as its decode server said (releases without the flag)


class PrefillSide:
    """A prefill server's queues: bootstrap, then the model, then the KV's way out.

    ``decode_tp``: the decode side's TP as ``--disaggregation-decode-tp`` gave it (SGLang
    0.5.9); None where the release learns it from the decode side itself (later releases:
    through the bootstrap, here in the decode's notices). ``queue_stages``: the release
    observes ``prefill_prepare`` and ``prefill_waiting`` (0.5.9); later ones observe the queue
    in ``sglang:queue_time_seconds`` and each transfer in the ``sglang:kv_transfer_*``
    histograms (``observed``: what the next scrape writes, in cluster time)."""

    def __init__(
        self, engine: Engine, profile: Profile, *, nodes: int, decode_tp: int | None,
        queue_stages: bool = True,
    ) -> None:  # fmt: skip
        self.engine, self.profile, self.decode_tp = engine, profile, decode_tp
        self.queue_stages = queue_stages
        self.observed: list[tuple[str, float]] = []  # (histogram, value) for the next scrape
        self.keep_observed = True  # False without --enable-metrics: nothing scrapes them
        self.egress = Link(side_bandwidth(profile, nodes))
        self.stages = StageLatencies()
        self.rooms: dict[int, _PrefillRoom] = {}
        self.by_rid: dict[str, int] = {}
        # answers before the request: (line, at, the decode's TP)
        self.early: dict[int, tuple[Line, float | None, int | None]] = {}
        self.inflight: list[tuple[float, float]] = []  # (prefilled, transfer done)
        engine.tokens_read = False  # the router reads this side's answers, not the client
        engine.bounds.append(self._bound)
        engine.sim.on_chunk = self._chunk

    # -- requests ---------------------------------------------------------------------------
    def submit(self, rid: str, prompt: int, boot: Bootstrap) -> Stream:
        """A request's prefill copy arrives (SGLang makes one token of it)."""
        if boot.fake:
            return self.engine.submit(rid, prompt, 1)
        at = self._arrive()
        if self.queue_stages:
            self.stages.observe("prefill_prepare", 0.0)
        room = _PrefillRoom(rid, prompt, at, time.monotonic() + HOLD_STALL_S)
        self.rooms[boot.room], self.by_rid[rid] = room, boot.room
        stream = self.engine.expect(rid, prompt, 1)
        if boot.room in self.early:
            self._answer(boot.room, *self.early.pop(boot.room))
        self.engine.wake.set()
        return stream

    def forget(self, rid: str) -> None:
        """The request went away (its client, or the router, gave up)."""
        room = self.by_rid.pop(rid, None)
        if room is not None:
            self.rooms.pop(room, None)

    def hear(self, line: Line, message: dict[str, Any]) -> None:
        """A decode server's notice: whether (and from when) it has room for ``room``."""
        self._arrive(request=False)
        room, at = int(message["room"]), message.get("at")
        if room in self.rooms:
            self._answer(room, line, at, message.get("tp"))
        else:
            self.early[room] = (line, at, message.get("tp"))
        self.engine.wake.set()

    # -- internals --------------------------------------------------------------------------
    def _arrive(self, *, request: bool = True) -> float:
        shared = self.engine.shared
        if shared is None:
            return self.engine.cluster_now()
        return shared.arrive(request=request)

    def _answer(self, room_id: int, line: Line, at: float | None, tp: int | None) -> None:
        room = self.rooms[room_id]
        room.line, room.answered = line, True
        room.decode_tp = room.decode_tp or tp
        if at is None:  # queued on the decode side: a later notice gives the time
            return
        room.ready = max(room.arrived, self.engine.from_common(float(at)))
        self.stages.observe("prefill_bootstrap", room.ready - room.arrived)
        self.engine.submit_at(room.rid, room.prompt, 1, room.ready)

    def _bound(self) -> float:
        """The clock may not pass a request whose decode side has not answered yet."""
        wall = time.monotonic()
        waiting = [r.arrived for r in self.rooms.values() if not r.answered and wall < r.answer_by]
        return min(waiting, default=INF)

    def _chunk(self, req: SimRequest, tokens: int, started: float, done: float) -> None:
        room_id = self.by_rid.get(req.rid)
        if room_id is None:  # a fake bootstrap: nothing to send
            return
        room = self.rooms[room_id]
        room.chunks.append((started, done))
        decode_tp = self.decode_tp or room.decode_tp or 1
        room.spans.append(self.egress.send(done, kv_bytes(self.profile, tokens, decode_tp)))
        if req.prefilled < req.prompt_tokens:
            return
        ready = room.ready or room.arrived
        if self.queue_stages:
            mark = _observe_chunks(self.stages, ready, room.chunks, done)
        else:
            _observe_chunks_traced(self.stages, room.chunks, done)
            mark = done
        sent = room.spans[-1].end
        self.stages.observe("prefill_transfer_kv_cache", sent - mark)
        if not self.queue_stages:
            self._observe_transfer(room, room.chunks[0][0] - ready, sent - mark)
        self.inflight.append((done, sent))
        if room.line is not None:
            _hold(self.engine)
            common = self.engine.to_common
            room.line.send({"room": room_id, "spans": [[common(s.start), common(s.end), s.size]
                                                       for s in room.spans]})  # fmt: skip
        del self.rooms[room_id]
        self.by_rid.pop(req.rid, None)

    def _observe_transfer(self, room: _PrefillRoom, queued: float, latency: float) -> None:
        """0.5.10 and later (``compute_and_observe_kv_transfer_metrics``): the wait before the
        first forward, and the transfer, from the last chunk's end until all of it was sent:
        its size and speed; the bootstrap's time (allocation takes none here). Cluster
        seconds, as this side's per-stage latencies."""
        if not self.keep_observed:
            return
        self.observed.append(("sglang:queue_time_seconds", queued))
        if latency <= 0:
            return
        mb = sum(span.size for span in room.spans) / (1024 * 1024)
        self.observed += [("sglang:kv_transfer_latency_ms", latency * 1000.0),
                          ("sglang:kv_transfer_total_mb", mb),
                          ("sglang:kv_transfer_speed_gb_s", mb / 1024 / latency)]  # fmt: skip
        if room.ready is not None:
            self.observed += [("sglang:kv_transfer_bootstrap_ms",
                               (room.ready - room.arrived) * 1000.0),
                              ("sglang:kv_transfer_alloc_ms", 0.0)]  # fmt: skip

    # -- gauges -----------------------------------------------------------------------------
    def gauges(self, now: float) -> dict[str, float]:
        self.inflight = [(a, b) for a, b in self.inflight if b > now]
        waiting = sum(1 for r in self.rooms.values() if r.ready is None or r.ready > now)
        moving = sum(1 for a, b in self.inflight if a <= now < b)
        return {"num_prefill_prealloc_queue_reqs": waiting,
                "num_prefill_inflight_queue_reqs": moving}  # fmt: skip


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
        now = self.engine.cluster_now()
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
            self._preallocate(boot.room, max(now, self.engine.cluster_now()))
        else:
            self.prealloc.append(boot.room)
            _hold(self.engine)
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
        mine = self.engine.from_common
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
            _hold(self.engine)
            room.line.send({"room": room_id, "at": self.engine.to_common(at), "tp": self.tp})

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


def _hold(engine: Engine) -> None:
    """A notice is on its way to the other side: the clock waits until it is taken in."""
    if engine.shared is not None:
        engine.shared.hold_if_attached(1)
