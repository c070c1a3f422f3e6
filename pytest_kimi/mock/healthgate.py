"""Test-only: hold generation requests until a ``/health`` probe has been answered late while
the server was busy (fault knob ``hold_until_late_health``).

With ``health=busy_slow:S`` a health checker only meets a slow ``/health`` if one of its probes
happens to land while requests are in flight; a short run on a fast (or slow) machine can end
before one does, and a test that hopes for it is a race. With this knob a generation request is
held before it reaches the scheduler (nothing is sent yet; it counts as in flight, so
``/health`` is busy) until one probe that arrived while busy has waited its S seconds. A checker
whose timeout is under S has then seen a timed-out health check, every time, whatever the
machine's speed. It happens once per process: after that, nothing is held.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("sglang.mock")

HOLD_LIMIT_S = 120.0  # a checker that never probes must not hang the run: release, say so


class HealthGate:
    """Closed until a busy ``/health`` probe has been answered late; counts who waits on it."""

    def __init__(self, limit_s: float = HOLD_LIMIT_S) -> None:
        self.limit_s = limit_s
        self.opened = asyncio.Event()
        self.held = 0  # generation requests waiting at the gate now

    async def hold(self) -> None:
        """Wait until the gate opens (at once if it already has); counted in ``held`` meanwhile."""
        if self.opened.is_set():
            return
        self.held += 1
        try:
            await asyncio.wait_for(self.opened.wait(), self.limit_s)
        except asyncio.TimeoutError:
            if not self.opened.is_set():
                log.error(
                    "mock fault: no /health probe was answered late within %gs while busy; "
                    "releasing held requests",
                    self.limit_s,
                )
                self.opened.set()
        finally:
            self.held -= 1

    def probe_answered_late(self, delay_s: float, client_gone: bool) -> None:
        """A probe that arrived while busy waited ``delay_s``: open the gate (once)."""
        if self.opened.is_set():
            return
        log.info(
            "mock fault: /health answered %gs late while busy (client %s); releasing %d held "
            "request(s)",
            delay_s,
            "had given up" if client_gone else "still waiting",
            self.held,
        )
        self.opened.set()
