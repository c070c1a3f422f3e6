"""A cancel hook for the benchmark client that another thread can pull.

The watchdog (:mod:`pytest_kimi.deploy.watchdog`) runs in a thread of its own, while the client runs
under ``asyncio.run`` in the main thread. It must stop the run without signals to the main
thread (they would look like Ctrl-C, and land anywhere): :meth:`Abort.trip` cancels the
guarded task on its own loop (``call_soon_threadsafe``), every request in flight is cancelled
where it awaits (its record kept, unfinished), and :meth:`Abort.guard` raises
:class:`RunAborted` with the reason.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


class RunAborted(RuntimeError):
    """The run was stopped from outside (:class:`Abort`): the message says why."""


class Abort:
    """A cancel hook: :meth:`trip` (any thread) cancels the run :meth:`guard` awaits.
    Tripped before a run starts, the run sends nothing; tripping is sticky, so every later
    guarded run is refused at once."""

    def __init__(self) -> None:
        self.reason = ""
        self._fired = False  # whether we cancelled the guarded task (not someone else)
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None

    @property
    def tripped(self) -> bool:
        return bool(self.reason)

    def trip(self, reason: str) -> None:
        """From any thread: stop the guarded run (the first reason is kept)."""
        with self._lock:
            if self.reason:
                return
            self.reason = reason
            target = self._target
            if target is not None:  # the loop runs while a target is set (guard clears it)
                target[0].call_soon_threadsafe(self._cancel, target)

    def _cancel(self, target: tuple[asyncio.AbstractEventLoop, asyncio.Task]) -> None:
        """On the loop: cancel the task only if it is still the one guarded (a trip landing
        just as the run ended must not cancel what runs after it)."""
        if self._target is target:
            self._fired = True
            target[1].cancel("aborted: " + self.reason)

    async def guard(self, work: Coroutine[Any, Any, None]) -> None:
        """Await ``work`` in this task; a trip cancels it and raises :class:`RunAborted`."""
        task = asyncio.current_task()
        assert task is not None
        with self._lock:
            if self.reason:
                work.close()
                raise RunAborted(self.reason)
            target = (asyncio.get_running_loop(), task)
            self._target = target
        try:
            await work
        except asyncio.CancelledError:
            if not self._fired or task.cancelling() > 1:
                raise  # someone else's cancellation (Ctrl-C) as well: theirs wins
            task.uncancel()
            raise RunAborted(self.reason) from None
        finally:
            with self._lock:
                self._target = None
