"""Progress as plain lines: for logs, CI, pipes and xdist workers (no cursor control).

Bring-up: one line per process as it becomes healthy, one when the router is ready. Measuring:
a line at each tenth of the requests (every request when there are fewer than ten), with
output tokens/s and elapsed time in cluster time, a process's last log line when it changed
(``logs.tail_report_s``), then one line when the layout is done.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_kimi.results.events import (
    Event,
    LayoutDone,
    LogLine,
    MeasureStarted,
    Message,
    NodeChanged,
    NodeLog,
    RequestFinished,
)
from pytest_kimi.run.progress.model import ProgressModel, RunRow, rate_text


class PlainProgress:
    """Writes one line per noteworthy event through ``write``; ``events=False`` writes only
    :class:`Message` text (``--kimi-progress=off``: no progress, but what the run has to say)."""

    def __init__(self, write: Callable[[str], None], events: bool = True) -> None:
        self.write, self.events = write, events
        self.model = ProgressModel()
        self._tenths: dict[str, int] = {}  # layout -> tenths of its requests already reported

    def emit(self, event: Event) -> None:
        if isinstance(event, Message):
            self.write(event.text)
            return
        self.model.apply(event)
        line = self.line(event) if self.events else None
        if line is not None:
            self.write(line)

    def close(self) -> None:
        pass

    def line(self, event: Event) -> str | None:
        """The line ``event`` deserves (the model already holds it), or None."""
        if isinstance(event, NodeChanged):
            return node_line(self.model, event)
        if isinstance(event, NodeLog):
            return log_line(self.model, event)
        if isinstance(event, LogLine):
            return run_log_line(event)
        if isinstance(event, MeasureStarted):
            self._tenths[event.layout] = 0
            return f"[kimi {event.layout}] measuring {event.total} requests"
        if isinstance(event, RequestFinished):
            run = self.model.layout(event.layout).run
            if run is None:
                return None
            tenth = run.done * 10 // run.total if run.total else 10
            if tenth <= self._tenths.get(event.layout, 0) and run.done != run.total:
                return None
            self._tenths[event.layout] = tenth
            return f"[kimi {event.layout}] {run_status(run, event.at)}"
        if isinstance(event, LayoutDone):
            return done_line(self.model.layout(event.layout).run, event)
        return None


def node_line(model: ProgressModel, event: NodeChanged) -> str | None:
    """Healthy servers, the ready router and failures get a line; the rest is table-only."""
    view = model.layout(event.layout)
    row = view.nodes[event.name]
    head = f"[kimi {event.layout}]"
    if event.state == "healthy" and event.role == "server":
        return f"{head} {row.name} on {row.node} healthy after {row.elapsed(event.at):.1f}s"
    if event.state == "ready" and event.role == "router":
        return f"{head} router ready at {event.detail} after {view.bringup_s():.1f}s"
    if event.state == "failed":
        reason = event.detail.splitlines()[0] if event.detail else "failed"
        return f"{head} {row.name} on {row.node} failed: {reason}"
    return None


def log_line(model: ProgressModel, event: NodeLog) -> str:
    """``[kimi tp32] node603 replica0 rank2: starting, 312s (log: "Load weight end. ...")``."""
    row = model.layout(event.layout).nodes.get(event.name)
    who = f"replica{event.replica} rank{event.rank}" if event.replica is not None else event.role
    since = f", {row.elapsed(event.at):.0f}s" if row is not None else ""
    return f'[kimi {event.layout}] {event.node} {who}: {event.state}{since} (log: "{event.line}")'


def run_log_line(event: LogLine) -> str:
    """``[kimi tp32] log replica0-node0-node601 (node601): Decode batch. #running-req: 3``"""
    return f"[kimi {event.layout}] log {event.name} ({event.node}): {event.line}"


def run_status(run: RunRow, now: float) -> str:
    """``30/60 requests done (50%), 2 in flight, 1234 output tok/s, 12.3s cluster time,
    0 failed``: the figures the live bar shows, as text."""
    share = run.done / run.total if run.total else 1.0
    return (
        f"{run.done}/{run.total} requests done ({share:.0%}), {run.in_flight} in flight, "
        f"{rate_text(run.tokens_per_s(now))} output tok/s, {run.cluster_elapsed_s(now):.1f}s "
        f"cluster time, {run.failed} failed"
    )


def done_line(run: RunRow | None, event: LayoutDone) -> str:
    head = f"[kimi {event.layout}]"
    reason = event.error.splitlines()[0] if event.error else ""
    if run is None:
        return f"{head} not measured: {reason or 'no requests were sent'}"
    wall_s = run.cluster_elapsed_s(event.at) / run.time_scale
    figures = (
        f"{run.done}/{run.total} requests in {run.cluster_elapsed_s(event.at):.1f}s cluster "
        f"time ({wall_s:.1f}s wall), {rate_text(run.tokens_per_s(event.at))} output tok/s, "
        f"{run.failed} failed"
    )
    if reason:
        return f"{head} stopped after {figures}: {reason}"
    return f"{head} measured {figures}"
