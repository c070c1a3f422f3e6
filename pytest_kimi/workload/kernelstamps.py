"""When bytes reached a socket, as the kernel stamped them (Linux ``SO_TIMESTAMPNS``).

A process reads a socket when its event loop gets round to it: a busy loop, or a CPU taken
by another process, makes every time stamped at the read late. The kernel stamps each TCP
segment as it arrives, and ``recvmsg`` hands that stamp over: a time no lateness of ours can
move. Stamps are CLOCK_REALTIME; :func:`to_monotonic` puts them on CLOCK_MONOTONIC
(``time.perf_counter``, the clock of every other stamp here) by the offset between the two
clocks read at that moment.

Where the option does not exist (not Linux) :func:`enable` says so and readers fall back to
the time they read. They do the same for a segment without a stamp: Linux switches stamping
on for the whole system lazily (the first socket that asks schedules it on a work queue), so
the first segments a quiet machine receives after that may carry none.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import time
from collections.abc import Iterator

# Python 3.11's socket module does not name it: 35 is its value on Linux for x86-64, arm64 and
# every architecture using the generic socket numbers (not alpha, parisc, sparc, mips)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else 0)
TIMESPEC = struct.Struct("@ll")  # struct timespec: time_t and long, the platform's sizes
ANCILLARY_SIZE = 64


def enable(sock: socket.socket) -> bool:
    """Have the kernel stamp what ``sock`` receives; False where it cannot."""
    if not SO_TIMESTAMPNS:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def offset() -> float:
    """CLOCK_REALTIME - CLOCK_MONOTONIC now: the realtime read bracketed by two monotonic
    reads, the tightest of three tries (a preemption between two reads would move it)."""
    best, gap = 0.0, float("inf")
    for _ in range(3):
        before = time.perf_counter()
        real = time.clock_gettime(time.CLOCK_REALTIME)
        after = time.perf_counter()
        if after - before < gap:
            best, gap = real - (before + after) / 2, after - before
    return best


def to_monotonic(realtime_s: float) -> float:
    """A CLOCK_REALTIME instant on CLOCK_MONOTONIC (``perf_counter``), by the clocks' offset
    now (it drifts by ppm; only a step of the wall clock moves it)."""
    return realtime_s - offset()


def stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The arrival stamp in ``recvmsg``'s ancillary data, on CLOCK_MONOTONIC; None if absent.
    For a read that spans several segments it is the last one's."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            seconds, nanos = TIMESPEC.unpack(data[: TIMESPEC.size])
            return to_monotonic(seconds + nanos / 1e9)
    return None


@contextlib.contextmanager
def held_on(timeout_s: float = 2.0) -> Iterator[bool]:
    """Keep the kernel's stamping switched on while inside, and enter only once it is on.

    Linux turns stamping on for the whole system when the first socket asks, but later, from
    a work queue, and off again when the last one closes: on a busy machine the first segments
    of a run can arrive before the work queue ran, unstamped, and their times fall back to the
    read (late by however long the loop was busy). Here a loopback TCP pair asks and stays
    open; bytes sent over it show when stamps appear (within ``timeout_s``). TCP, because a
    datagram that raced the switch is handed over with the time of its read as its stamp,
    which would look like stamping already on. Yields whether it is on (False: not Linux, no
    loopback, or the work queue did not run in time); either way the run goes on."""
    with contextlib.ExitStack() as held:
        try:
            on = _switch_on(held, timeout_s)
        except OSError:
            on = False
        yield on


def _switch_on(held: contextlib.ExitStack, timeout_s: float) -> bool:
    listener = held.enter_context(socket.socket())
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    if not enable(listener):
        return False
    client = held.enter_context(socket.create_connection(listener.getsockname(), timeout_s))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each byte: its own segment
    server = held.enter_context(listener.accept()[0])  # it asks too (the listener's option)
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        client.sendall(b".")
        server.settimeout(left)
        _, ancillary, _, _ = server.recvmsg(16, ANCILLARY_SIZE)
        if stamp(ancillary) is not None:
            return True
        time.sleep(0.001)  # the work queue's turn
    return False
