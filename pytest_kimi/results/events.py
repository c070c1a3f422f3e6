"""The progress events the run's steps emit, and the one method a display has.

Events are frozen dataclasses stamped with ``time.perf_counter()`` (the clock request records
use), so a display can compute elapsed times and rates without a clock of its own; tests pass
``at`` explicitly and never wait. Standard library only: bring-up and measuring import this
whatever display is in use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

NodeState = Literal["starting", "healthy", "ready", "failed"]
"""A process's bring-up state: launched; its replica answers ``/health`` and
``/model_info`` (servers); serving (the router counts every replica; servers once warm);
exited or never became healthy."""


def _now() -> float:
    return time.perf_counter()


@dataclass(frozen=True)
class NodeChanged:
    """One process of a layout's deployment changed state (``name`` is unique per layout)."""

    layout: str
    name: str  # the process's name in the plan, e.g. "replica0-rank1"
    node: str  # the cluster node it runs on
    role: str  # "server" or "router"
    replica: int | None
    rank: int | None
    state: NodeState
    detail: str = ""  # the URL when healthy or ready, the reason when failed
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class NodeLog:
    """A process still coming up, at the bring-up's report interval (``startup_report_s``):
    its state and the last line of its log, so a 30-minute start-up shows where each node is."""

    layout: str
    name: str
    node: str
    role: str
    replica: int | None
    rank: int | None
    state: str  # "starting" (its health does not answer yet) or "healthy" (waits for others)
    line: str  # the last non-empty line of its log
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class LogLine:
    """While a layout is measured, at ``logs.tail_report_s``: a process's last log line, sent
    only when it changed since the previous report (a quiet process says nothing new)."""

    layout: str
    name: str  # the process's name in the plan, e.g. "replica0-node0-node601", or "router"
    node: str  # the cluster node it runs on
    line: str  # the last non-empty line of its log, as written (at most ~160 characters)
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class BringUpDone:
    """Every replica answered its warm-up: the deployment is ready to measure."""

    layout: str
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class MeasureStarted:
    """The measured requests (warm-up excluded) begin; ``time_scale`` turns wall seconds
    into cluster seconds (1 on a real cluster)."""

    layout: str
    total: int
    time_scale: float = 1.0
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class RequestStarted:
    """A measured request is about to be sent."""

    layout: str
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class RequestFinished:
    """A measured request ended (``success`` False: failed; its tokens still count)."""

    layout: str
    output_tokens: int
    success: bool
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class LayoutDone:
    """Measuring the layout ended; ``error`` says why if it stopped early or never ran."""

    layout: str
    error: str = ""
    at: float = field(default_factory=_now)


@dataclass(frozen=True)
class Message:
    """A line of text for the user (what ``say`` printed before events existed)."""

    text: str


Event = (
    NodeChanged
    | NodeLog
    | LogLine
    | BringUpDone
    | MeasureStarted
    | RequestStarted
    | RequestFinished
    | LayoutDone
    | Message
)


class Progress(Protocol):
    """Where the steps send their events. ``close`` ends any live display."""

    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


class NoProgress:
    """``--kimi-progress=off``: shows nothing."""

    def emit(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass
