"""One cluster clock for the mock's processes and the benchmark client of a local run.

Why: the mock plays cluster time at ``time_scale`` times wall time. Whatever the client, the
router and HTTP spend in wall time between two model events is then multiplied into cluster
time: 12 ms of client turnaround is half a second of a 1:40 cluster in which the freed slot
sends nothing, enough to lock the two replicas into waves (docs/mock.md, "One clock").
A real cluster's client reacts in a few real milliseconds.

So time is shared and held. The clock runs at ``scale`` cluster seconds per wall second
while nobody holds it, and never runs past the earliest *bound*:

* each engine bounds the clock at its next event, so a late wake-up of a mock process never
  moves a token in cluster time;
* a message the model has sent but its receiver has not taken in yet *holds* the clock: the
  engine holds it for a request's first and last token until the client has read them, and
  the client holds it for a request it is about to send until an engine has taken it in.

While held, every process sees the same frozen time, so the wall time spent on the wire and
in the client is kept out of cluster time; it is counted (:attr:`Stats.held_wall_s`) and
reported. A hold nobody releases (a request lost to a fault) is dropped after
:func:`hold_stall_s` of wall time without any change (2 s on an idle machine, more on a
loaded one), and counted; a bound whose process died is dropped too. Holding is always safe
for accuracy: a frozen clock only costs wall time.

The state is one small file under a lock (``flock``): every process on the machine that
opens the same path shares it (:mod:`pytest_kimi.workload.clockfile`). Without a path (a real
cluster, an SSH mock) there is no shared clock, and the client uses wall time
(:class:`WallClock` in :mod:`pytest_kimi.workload.clocks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.workload.clockfile import SLOTS, ClockFile, ClockState, write_new
from pytest_kimi.workload.pids import pid_alive

HOLD_STALL_S = 2.0  # wall seconds a hold may stand with nothing changing on an idle machine
# (a busy 2-core machine has held one 0.4 s while a burst of 16K-token requests went out one
# by one); more on a loaded one: hold_stall_s()
BOUND_STALL_S = 0.2  # wall seconds at a bound before its owner's life is checked
INF = math.inf


@dataclass(frozen=True)
class Stats:
    """What holding cost, for the run's notes: wall seconds the clock stood still."""

    held_wall_s: float  # frozen by holds: client, router and HTTP kept out of cluster time
    bound_wall_s: float  # waiting at an engine's bound: mock processes waking up late
    stalls: int  # holds dropped (nobody released them) or bounds of dead processes
    longest_hold_s: float  # the longest single stretch the clock stood held (wall)


class SharedClock:
    """A file-backed cluster clock; every method is safe across processes."""

    in_order = True  # a client sends at one held instant in order: free, and repeatable

    def __init__(self, path: str | Path, wall: Callable[[], float] = time.monotonic) -> None:
        self.path, self.wall = Path(path), wall
        self._slot: int | None = None
        self._file = ClockFile(self.path)
        first = self._file.peek()
        self.scale, self.origin = first.scale, first.origin_wall
        self._bound = INF  # this process's slot's bound, as last written

    @classmethod
    def create(
        cls, path: str | Path, scale: float, wall: Callable[[], float] = time.monotonic
    ) -> SharedClock:
        """A new clock at cluster time 0, running (replaces a file left by an earlier run)."""
        if not scale > 0:
            raise ValueError(f"time scale must be > 0, got {scale!r}")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        now = wall()
        state = ClockState(scale, now, 0.0, 0, now, 0, 0, 0.0, 0.0, INF, 0.0, 0.0, now, 0,
                           [(0, INF)] * SLOTS)  # fmt: skip
        write_new(target, state)
        return cls(target, wall)

    def close(self) -> None:
        if self._slot is not None:
            with contextlib.suppress(ValueError, OSError):
                self.leave()
        self._file.close()

    # -- reading -------------------------------------------------------------------------
    def cluster_now(self) -> float:
        """Cluster seconds since the clock was created."""
        state = self._file.peek()
        wall = self.wall()
        if _stuck(state, wall):
            return self._update(lambda s: None)
        return state.cluster_at(wall)

    def now(self) -> float:
        """The clock in wall-equivalent seconds, what a client stamps: the monotonic wall
        clock at cluster time 0 plus cluster seconds / scale. Differences times the time
        scale are cluster time, as everywhere else, and readings stay near
        ``time.perf_counter()`` (behind it by the time the clock stood still), so a display
        that keeps wall time is near enough."""
        return self.origin + self.cluster_now() / self.scale

    def held(self) -> bool:
        return self._file.peek().holds > 0

    def taken(self) -> int:
        """How many requests engines have taken in (:meth:`arrive`) while a client took part:
        a client sending one request at a time knows its request arrived when this grows."""
        return self._file.peek().taken

    def attached(self) -> bool:
        """Whether a client takes part (holds for tokens are only taken while one does)."""
        return self._file.peek().attached > 0

    def stats(self) -> Stats:
        s = self._file.peek()
        return Stats(s.held_wall, s.bound_wall, s.stalls, s.longest_hold)

    # -- holding -------------------------------------------------------------------------
    def hold(self, n: int = 1) -> None:
        """Stop the clock until ``n`` matching :meth:`release` calls (from any process)."""
        if n > 0:
            self._update(lambda s: setattr(s, "holds", s.holds + n))

    def release(self, n: int = 1) -> None:
        """Undo ``n`` holds (never below none: a release with nothing held is a no-op)."""
        if n > 0:
            self._update(lambda s: setattr(s, "holds", max(0, s.holds - n)))

    def hold_if_attached(self, n: int = 1) -> bool:
        """An engine's hold for tokens a client will read: only while a client takes part."""
        if n <= 0 or not self.attached():
            return False
        took = [False]

        def change(s: ClockState) -> None:
            if s.attached > 0 and n > 0:
                s.holds += n
                took[0] = True

        self._update(change)
        return took[0]

    def release_if_attached(self, n: int = 1) -> None:
        self._update(lambda s: setattr(s, "holds", max(0, s.holds - n)) if s.attached else None)

    @contextlib.contextmanager
    def attach(self) -> Iterator[SharedClock]:
        """A client takes part for the block; what it leaves held is let go at the end."""
        self._update(lambda s: setattr(s, "attached", s.attached + 1))
        try:
            yield self
        finally:
            self.leave()

            def detach(s: ClockState) -> None:
                s.attached = max(0, s.attached - 1)
                if s.attached == 0:
                    s.holds = 0

            self._update(detach)

    async def sleep_until(self, t: float) -> None:
        """Until :meth:`now` reaches ``t``, with the clock bounded there meanwhile: an
        open-loop client's next send happens at its cluster time however late this process
        wakes. The bound stays until the next call (or :meth:`leave`): the caller holds the
        clock for the request it sends first."""
        self.bound_at(t)
        target = (t - self.origin) * self.scale
        while (now := self.cluster_now()) < target:
            await asyncio.sleep(max((target - now) / self.scale, 0.0005))

    def bound_at(self, t: float) -> None:
        """The clock may not pass ``t`` (a :meth:`now` reading) until bound again."""
        if self._slot is None:
            self.join()
        self.bound((t - self.origin) * self.scale)

    def clear_bound(self) -> None:
        """This process schedules nothing more: its bound no longer stops the clock."""
        if self._slot is not None:
            self.bound(INF)

    # -- bounds (one slot per process with events of its own) ---------------------------
    def join(self) -> None:
        """Take a slot for this process's bound (a free one, or one whose process died)."""

        def claim(s: ClockState) -> None:
            for i, (pid, _) in enumerate(s.slots):
                if pid == 0 or not pid_alive(pid):
                    s.slots[i] = (os.getpid(), INF)
                    self._slot, self._bound = i, INF
                    return
            raise RuntimeError(f"{self.path}: all {SLOTS} clock slots are taken")

        self._update(claim)

    def leave(self) -> None:
        slot = self._slot
        if slot is not None:
            self._update(lambda s: s.slots.__setitem__(slot, (0, INF)))
            self._slot = None

    def bound(self, at: float) -> None:
        """The clock may not pass cluster time ``at`` (inf: no bound) until moved again."""
        slot = self._slot
        if slot is None:
            raise RuntimeError("bound() before join()")

        if self._bound == at:
            return  # this process's bound is already there: nothing to write
        self._update(lambda s: s.slots.__setitem__(slot, (s.slots[slot][0], at)))
        self._bound = at

    def arrive(self, *, request: bool = True) -> float:
        """A request reaches an engine: the reading now, with this engine's bound pulled
        back to it (the model has not taken the request in yet) and, while a client takes
        part, the hold that client took before sending let go. One step, so the clock cannot
        move in between. ``request=False``: a notice between two mock processes (its
        sender's hold let go the same way), not counted in :meth:`taken`."""
        slot = self._slot
        if slot is None:
            raise RuntimeError("arrive() before join()")
        seen = [0.0]

        def change(s: ClockState) -> None:
            now = s.anchor_cluster  # _update re-anchored at this instant
            pid, old = s.slots[slot]
            s.slots[slot] = (pid, min(old, now))
            self._bound = min(old, now)
            if s.attached:
                s.holds = max(0, s.holds - 1)
                s.taken += request
            seen[0] = now

        self._update(change)
        return seen[0]

    # -- internals ---------------------------------------------------------------------------
    def _update(self, change: Callable[[ClockState], None]) -> float:
        """Re-anchor at now under the old state, apply ``change``; return the reading."""
        with self._file.locked():
            s = self._file.read_all()
            wall = self.wall()
            _apply(s, wall, change)
            self._file.write(s)
            return s.cluster_at(wall)


def _apply(s: ClockState, wall: float, change: Callable[[ClockState], None]) -> None:
    """Re-anchor ``s`` at ``wall`` (what stood still since counted by cause; a stuck hold or
    a dead process's bound let go), apply ``change``, and keep the earliest bound, the time of
    the last change and the longest hold up to date."""
    stuck = _stuck(s, wall)
    _account(s, wall)
    s.anchor_cluster, s.anchor_wall = s.cluster_at(wall), wall
    if stuck:
        if s.holds > 0:
            s.longest_hold = max(s.longest_hold, wall - s.held_since)
        _unstick(s)
        s.changed_wall = wall  # the reading restarts from here
    before = (s.holds, s.bound, s.attached)
    change(s)
    s.bound = min((b for pid, b in s.slots if pid), default=INF)
    if (s.holds, s.bound, s.attached) != before:
        s.changed_wall = wall
    if before[0] == 0 and s.holds > 0:
        s.held_since = wall
    elif before[0] > 0 and s.holds == 0:
        s.longest_hold = max(s.longest_hold, wall - s.held_since)


def hold_stall_s() -> float:
    """How long a hold may stand with nothing changing before it is taken for lost:
    :data:`HOLD_STALL_S` times the machine's load per core (the last minute's, at least 1).
    Every process of a local run shares the machine's cores: at a load of 14 on 2 cores (a
    CI machine running the suite on three workers beside real SGLang servers) a 16K-token
    request took over 2 s from the client's hold to its engine, and dropping that hold let
    cluster time run while it was on its way."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return HOLD_STALL_S * max(1.0, per_core)


def _stuck(state: ClockState, wall: float) -> bool:
    """A hold standing too long with nothing changing, or (perhaps: a reader's copy has no
    slots; :meth:`SharedClock._update` looks again with them) a bound whose owner is gone."""
    idle = wall - state.changed_wall
    if state.holds > 0:
        return idle > HOLD_STALL_S and idle > hold_stall_s()
    if idle <= BOUND_STALL_S or state.cluster_at(wall) < state.bound:
        return False
    return _dead_bounds(state) if state.slots else True


def _account(s: ClockState, wall: float) -> None:
    """Add the wall time since the anchor that the clock stood still, by cause."""
    span = max(0.0, wall - s.anchor_wall)
    if s.holds > 0:
        s.held_wall += span
        return
    bound = s.bound
    if bound < INF:
        running = max(0.0, (bound - s.anchor_cluster) / s.scale)
        s.bound_wall += max(0.0, span - running)


def _unstick(s: ClockState) -> None:
    if s.holds > 0:
        s.holds = 0
        s.stalls += 1
    for i, (pid, _) in enumerate(s.slots):
        if pid and not pid_alive(pid):
            s.slots[i] = (0, INF)
            s.stalls += 1


def _dead_bounds(s: ClockState) -> bool:
    return any(pid and b < INF and not pid_alive(pid) for pid, b in s.slots)
