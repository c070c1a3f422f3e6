"""The shared cluster clock's state file: its layout, its lock, and how it is read and written.

The clock (:class:`pytest_kimi.workload.sharedclock.SharedClock`) keeps all its state in one
small file that every process on the machine maps: a header (magic, sequence number), the
state (:class:`ClockState`) and one slot per process with a bound of its own. Writers take an
exclusive ``flock``; readers that need no slots read without it, under a seqlock (the
sequence number is odd while a writer writes). Kept apart from the clock's operations (hold,
release, bound, arrive) so that those read as what they do to the state, not how it is stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"kimiclk4"
# magic, seq, then the state: scale, anchor_wall, anchor_cluster, holds, changed_wall,
# attached, stalls, held_wall, bound_wall, bound (the earliest slot's), held_since (wall, while
# held), longest_hold (wall seconds), origin_wall (wall time at cluster time 0), taken (requests
# engines took in while a client took part)
_HEADER = struct.Struct("<8sq")
_STATE = struct.Struct("<dddqdqqddddddq")
SLOTS = 32  # per slot: pid, bound (cluster seconds; inf: none)
_ALL_SLOTS = struct.Struct("<" + "qd" * SLOTS)
_SLOTS_AT = _HEADER.size + _STATE.size
SIZE = _SLOTS_AT + _ALL_SLOTS.size


@dataclass
class ClockState:
    """What the file holds: the clock's anchor, its holds and bounds, and what they cost."""

    scale: float
    anchor_wall: float
    anchor_cluster: float
    holds: int
    changed_wall: float
    attached: int
    stalls: int
    held_wall: float
    bound_wall: float
    bound: float  # the earliest slot's bound (kept with the state: readers skip the slots)
    held_since: float  # wall time the current hold began (holds > 0)
    longest_hold: float  # wall seconds of the longest single stretch held
    origin_wall: float  # the monotonic wall clock when the clock was made (cluster time 0)
    taken: int  # requests an engine took in (arrive) while a client took part
    slots: list[tuple[int, float]]  # empty in a reader's copy

    def cluster_at(self, wall: float) -> float:
        """The clock's reading at ``wall``: frozen while held, else running up to the bound."""
        if self.holds > 0:
            return self.anchor_cluster
        running = self.anchor_cluster + (wall - self.anchor_wall) * self.scale
        return max(self.anchor_cluster, min(running, self.bound))


def write_new(target: Path, state: ClockState) -> None:
    """A new state file at ``target``, whole or not at all (replaces one left by an earlier
    run)."""
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(_HEADER.pack(MAGIC, 0) + _pack(state))
    os.replace(tmp, target)


class ClockFile:
    """One process's mapping of a clock's state file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(self.path, os.O_RDWR)
        self._closer = weakref.finalize(self, os.close, self._fd)  # exactly once
        try:
            self._map = mmap.mmap(self._fd, SIZE)
        except (OSError, ValueError):
            self._closer()
            raise
        if bytes(self._map[:8]) != MAGIC:
            self.close()
            raise ValueError(f"{self.path}: not a mock clock file")

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._map.close()
        with contextlib.suppress(OSError):
            self._closer()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The exclusive lock, for a read of the whole state and its write."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def peek(self) -> ClockState:
        """The state without the slots, read without a lock: a sequence number that a writer
        makes odd while it writes, read before and after (a seqlock), says the copy is whole."""
        while True:
            before = _HEADER.unpack_from(self._map, 0)[1]
            values = _STATE.unpack_from(self._map, _HEADER.size)
            if before % 2 == 0 and _HEADER.unpack_from(self._map, 0)[1] == before:
                return ClockState(*values, slots=[])

    def read_all(self) -> ClockState:
        """The whole state with the slots (the caller holds the lock)."""
        values = _STATE.unpack_from(self._map, _HEADER.size)
        flat = _ALL_SLOTS.unpack_from(self._map, _SLOTS_AT)
        return ClockState(*values, slots=list(zip(flat[::2], flat[1::2], strict=True)))

    def write(self, s: ClockState) -> None:
        """Under the lock: odd sequence number, the state, even again."""
        seq = _HEADER.unpack_from(self._map, 0)[1]
        _HEADER.pack_into(self._map, 0, MAGIC, seq + 1)
        self._map[_HEADER.size :] = _pack(s)
        _HEADER.pack_into(self._map, 0, MAGIC, seq + 2)


def _pack(s: ClockState) -> bytes:
    """The state and its slots, as they sit after the header."""
    head = _STATE.pack(
        s.scale, s.anchor_wall, s.anchor_cluster, s.holds, s.changed_wall,
        s.attached, s.stalls, s.held_wall, s.bound_wall, s.bound, s.held_since, s.longest_hold,
        s.origin_wall, s.taken,
    )  # fmt: skip
    return head + _ALL_SLOTS.pack(*(x for slot in s.slots for x in slot))
