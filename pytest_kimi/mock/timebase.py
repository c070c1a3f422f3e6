"""An engine's time base: which cluster time it is, and what a cluster time is elsewhere.

Without a shared clock cluster time is this process's own: wall seconds since the engine
started times ``time_scale`` (``time_scale`` 40 plays 40 cluster seconds in one wall second).
With a :class:`~pytest_kimi.workload.sharedclock.SharedClock` (a local run) it is the shared
clock's, the same number in every process. What another mock process or the time of day makes
of a cluster time follows from which of the two it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_kimi.workload.sharedclock import SharedClock


class TimeBase:
    """Cluster time for one engine, from its wall clock or the shared clock."""

    def __init__(
        self, time_scale: float, clock: Callable[[], float], shared: SharedClock | None
    ) -> None:
        self.time_scale, self.clock, self.shared = time_scale, clock, shared
        self.origin = clock()
        self.day_offset = time.time() - clock()  # this machine's time of day, less its clock

    def now(self) -> float:
        """The cluster time now."""
        if self.shared is not None:
            return self.shared.cluster_now()
        return (self.clock() - self.origin) * self.time_scale

    def deadline(self, t: float) -> float:
        """Without a shared clock: the reading of :attr:`clock` at which cluster time ``t``
        is played."""
        return self.origin + t / self.time_scale

    def to_common(self, t: float) -> float:
        """Cluster time ``t`` as another mock process reads it: the same number on a shared
        clock; without one each process counts from its own start, on its own machine, so
        the time of day (synchronised between machines) is what the two have in common."""
        if self.shared is not None:
            return t
        return self.origin + t / self.time_scale + self.day_offset

    def from_common(self, x: float) -> float:
        """The inverse of :meth:`to_common`, on this process's cluster time."""
        if self.shared is not None:
            return x
        return (x - self.day_offset - self.origin) * self.time_scale

    def wall_of(self, t: float) -> float:
        """Cluster time ``t`` as a time of day (``time.time()``): when this process played
        it. On a shared clock, which may have stood still since, the time of day now less
        the cluster time since ``t`` at the time scale."""
        if self.shared is None:
            return self.origin + t / self.time_scale + self.day_offset
        return time.time() - (self.now() - t) / self.time_scale
