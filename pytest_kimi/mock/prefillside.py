"""A prefill server's side of disaggregation (SGLang's ``srt/disaggregation/prefill.py``).

A request's prefill copy waits in the *bootstrap queue* until its decode server has room for
it, is prefilled making one token, sends each chunk's KV as the chunk is done, and waits in
the *inflight queue* until the transfer is done. How the two sides work together, and what is
not modelled: :mod:`pytest_kimi.mock.disagg`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pytest_kimi.mock.bootstrap import Line
from pytest_kimi.mock.disagg import Bootstrap, hold_for_notice
from pytest_kimi.mock.engine import Engine, Stream
from pytest_kimi.mock.kvlink import Link, Span, kv_bytes, side_bandwidth
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.mock.simrequest import SimRequest
from pytest_kimi.mock.stagelatency import StageLatencies
from pytest_kimi.workload.sharedclock import INF, hold_stall_s


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
        room = _PrefillRoom(rid, prompt, at, time.monotonic() + hold_stall_s())
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
            return self.engine.timebase.now()
        return shared.arrive(request=request)

    def _answer(self, room_id: int, line: Line, at: float | None, tp: int | None) -> None:
        room = self.rooms[room_id]
        room.line, room.answered = line, True
        room.decode_tp = room.decode_tp or tp
        if at is None:  # queued on the decode side: a later notice gives the time
            return
        room.ready = max(room.arrived, self.engine.timebase.from_common(float(at)))
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
            hold_for_notice(self.engine)
            common = self.engine.timebase.to_common
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
