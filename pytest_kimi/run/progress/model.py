"""Progress events folded into what a display shows: per layout, its processes' states and
its measured requests so far. Pure: time comes from the events and from the ``now`` a
display passes in, so the same sequence of events always gives the same view."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_kimi.results.events import (
    BringUpDone,
    Event,
    LayoutDone,
    LogLine,
    MeasureStarted,
    NodeChanged,
    NodeLog,
    NodeState,
    RequestFinished,
    RequestStarted,
)

RECENT_LOG_LINES = 5  # log lines of the measured run a live display keeps showing


@dataclass
class NodeRow:
    """One process of a deployment, as the bring-up table shows it."""

    name: str
    node: str
    role: str
    replica: int | None
    rank: int | None
    state: NodeState
    started_at: float  # when it was launched
    changed_at: float  # when it reached ``state``
    detail: str = ""

    def elapsed(self, now: float) -> float:
        """Wall seconds from launch to now while starting, else to the state it reached."""
        end = now if self.state == "starting" else self.changed_at
        return max(0.0, end - self.started_at)


@dataclass
class RunRow:
    """The measured requests of one layout so far. Cluster time is wall time x time_scale."""

    layout: str
    total: int
    time_scale: float
    started_at: float  # MeasureStarted; the first request's send replaces it
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    last_at: float | None = None  # the latest finish
    ended_at: float | None = None  # LayoutDone
    error: str = ""
    sent: int = 0

    def cluster_elapsed_s(self, now: float) -> float:
        """Cluster seconds since the first measured request was sent (as the summary's
        duration counts), up to now (or to the last finish)."""
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.started_at) * self.time_scale

    def tokens_per_s(self, now: float) -> float:
        """Output tokens per cluster second so far (0 before any time has passed)."""
        elapsed = self.cluster_elapsed_s(now)
        return self.output_tokens / elapsed if elapsed > 0 else 0.0

    @property
    def finished(self) -> bool:
        return self.ended_at is not None


@dataclass
class LayoutView:
    """Everything known about one layout: bring-up rows (in start order), then its run."""

    name: str
    nodes: dict[str, NodeRow] = field(default_factory=dict)
    ready: bool = False  # warm-up done
    run: RunRow | None = None
    error: str = ""  # LayoutDone's, also when measuring never started
    log_lines: list[LogLine] = field(default_factory=list)  # the latest, oldest first

    def bringup_s(self) -> float:
        """Wall seconds from the first launch to the router being ready (0 if unknown)."""
        rows = list(self.nodes.values())
        routers = [r for r in rows if r.role == "router" and r.state == "ready"]
        if not rows or not routers:
            return 0.0
        return max(0.0, routers[-1].changed_at - min(r.started_at for r in rows))


class ProgressModel:
    """Applies events in order; :attr:`layouts` is what every renderer draws from."""

    def __init__(self) -> None:
        self.layouts: dict[str, LayoutView] = {}

    def layout(self, name: str) -> LayoutView:
        return self.layouts.setdefault(name, LayoutView(name))

    def apply(self, event: Event) -> None:
        if isinstance(event, NodeChanged):
            self._node(event)
        elif isinstance(event, NodeLog):  # the row shows the latest log line
            row = self.layout(event.layout).nodes.get(event.name)
            if row is not None:
                row.detail = event.line
        elif isinstance(event, LogLine):  # the run's recent lines, a few kept
            view = self.layout(event.layout)  # a new list: a render thread reads the old whole
            view.log_lines = [*view.log_lines[-(RECENT_LOG_LINES - 1) :], event]
        elif isinstance(event, BringUpDone):
            view = self.layout(event.layout)
            view.ready = True
            for row in view.nodes.values():
                if row.role == "server" and row.state == "healthy":
                    row.state, row.changed_at = "ready", event.at
        elif isinstance(event, MeasureStarted):
            self.layout(event.layout).run = RunRow(
                event.layout, event.total, event.time_scale, event.at
            )
        elif isinstance(event, RequestStarted):
            run = self.layout(event.layout).run
            if run is not None:
                run.started_at = event.at if run.sent == 0 else run.started_at
                run.sent += 1
                run.in_flight += 1
        elif isinstance(event, RequestFinished):
            self._finished(event)
        elif isinstance(event, LayoutDone):
            view = self.layout(event.layout)
            view.error = event.error
            if view.run is not None:
                view.run.ended_at = view.run.last_at if view.run.last_at is not None else event.at
                view.run.error = event.error

    def _node(self, event: NodeChanged) -> None:
        rows = self.layout(event.layout).nodes
        row = rows.get(event.name)
        if row is None or event.state == "starting":
            rows[event.name] = NodeRow(
                event.name, event.node, event.role, event.replica, event.rank,
                event.state, event.at, event.at, event.detail,
            )  # fmt: skip
            return
        row.state, row.changed_at, row.detail = event.state, event.at, event.detail

    def _finished(self, event: RequestFinished) -> None:
        run = self.layout(event.layout).run
        if run is None:
            return
        run.done += 1
        run.in_flight = max(0, run.in_flight - 1)
        run.failed += 0 if event.success else 1
        run.output_tokens += event.output_tokens
        run.last_at = event.at if run.last_at is None else max(run.last_at, event.at)


def rate_text(per_s: float) -> str:
    """Tokens/s as people read them: 1234, 56.7, 0.5."""
    return f"{per_s:.0f}" if per_s >= 100 else f"{per_s:.1f}"
