"""Patience with a node that stopped answering: retries with exponential back-off under a
deadline.

A VPN blip, a switch reboot or a laptop lid closed for ten seconds must not abort a
30-minute model load, nor make teardown skip a node whose GPUs then keep serving. So a failed
connect (or a connection that dropped under a command that is safe to repeat) is tried again
after 0.5, 1, 2, 4 ... seconds (capped), until the patience (``ssh.reconnect_s`` while bringing
up and running, ``ssh.teardown_reconnect_s`` at teardown) is spent; only then is the node lost.
The clock and the sleep are injectable so tests drive time rather than wait for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: ``first_s``, then times ``factor``, never above ``cap_s``."""

    first_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 8.0

    def delays(self) -> Iterator[float]:
        delay = self.first_s
        while True:
            yield delay
            delay = min(delay * self.factor, self.cap_s)


def retrying(
    attempt: Callable[[], T],
    *,
    patience_s: float,
    retry_on: Callable[[BaseException], bool],
    backoff: Backoff = Backoff(),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[BaseException, float], None] = lambda exc, delay: None,
) -> T:
    """``attempt()``; while it raises what ``retry_on`` accepts, again after the next delay,
    as long as ``patience_s`` (from the first attempt) is not spent. The last attempt is made
    at the deadline at the latest; then its exception propagates. Other exceptions at once."""
    deadline = clock() + patience_s
    for delay in backoff.delays():
        try:
            return attempt()
        except Exception as exc:
            remaining = deadline - clock()
            if not retry_on(exc) or remaining <= 0:
                raise
            wait = min(delay, remaining)
            on_retry(exc, wait)
            sleep(wait)
    raise AssertionError("unreachable: delays() never ends")  # pragma: no cover


class Patience:
    """Per node: retries for its patience, who ran out of it, and whether teardown began.

    A node whose patience ran out is *unreachable*: while running it then gets one quick try
    per call (a watchdog poll may find it back; success clears it), at teardown none (it had
    the longest patience already, and teardown asks a dead node many things). Teardown starts
    with every node cleared, so one lost during the run is retried for the longest patience.
    """

    def __init__(
        self,
        retry_on: type[Exception],
        *,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retry_on, self.backoff, self.clock, self.sleep = retry_on, backoff, clock, sleep
        self.unreachable: dict[str, Exception] = {}
        self.teardown = False
        self.retries: list[str] = []  # "node: why" for every retry made (for reports and tests)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def begin_teardown(self) -> None:
        self.teardown = True
        self.unreachable.clear()

    def lock(self, name: str) -> threading.Lock:
        """One connect at a time per node (threads: watchdog, sampler, the main one)."""
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def call(self, name: str, attempt: Callable[[], T], *, run_s: float, teardown_s: float) -> T:
        """``attempt()`` retried while it raises ``retry_on``, for ``run_s`` (``teardown_s``
        once teardown began); then ``name`` is unreachable until an attempt succeeds."""
        if name in self.unreachable:
            if self.teardown:
                raise self.unreachable[name]
            patience = 0.0
        else:
            patience = teardown_s if self.teardown else run_s

        def on_retry(exc: BaseException, delay: float) -> None:
            self.retries.append(f"{name}: {exc}")

        try:
            out = retrying(attempt, patience_s=patience,
                           retry_on=lambda exc: isinstance(exc, self.retry_on),
                           backoff=self.backoff, clock=self.clock, sleep=self.sleep,
                           on_retry=on_retry)  # fmt: skip
        except self.retry_on as exc:
            self.unreachable[name] = exc
            raise
        self.unreachable.pop(name, None)
        return out
