"""A live progress display on a terminal (rich): the bring-up table, then a bar per layout.

The live area exists only while something is moving: from a layout's first process launch to
its warm-up being done, and from its first measured request to the layout being done (the
processes' latest log lines under the bar). Each
time it stops, its last frame stays on the screen, so the scrollback keeps every layout's
bring-up table and final bar. Messages print above the live area. Everything shown is
computed from the :class:`~pytest_kimi.run.progress.model.ProgressModel` and a clock, at render
time, so elapsed figures tick between events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pytest_kimi.results.events import (
    BringUpDone,
    Event,
    LayoutDone,
    LogLine,
    Message,
    NodeChanged,
    NodeLog,
)
from pytest_kimi.run.progress.model import LayoutView, NodeRow, ProgressModel, RunRow, rate_text
from pytest_kimi.run.progress.plain import done_line, run_log_line

STATE_STYLES = {"starting": "yellow", "healthy": "cyan", "ready": "green", "failed": "bold red"}
BAR_WIDTH = 24
REFRESH_PER_S = 2  # few frames: the render thread shares the GIL with the measuring client


class LiveProgress:
    """Draws the model on ``console`` while a phase runs; otherwise prints messages through
    ``write`` (pytest's terminal writer), calling ``before_live`` when a live area is about to
    start (to end pytest's current line)."""

    def __init__(
        self,
        console: Console,
        write: Callable[[str], None] | None = None,
        before_live: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.perf_counter,
        auto_refresh: bool = True,
    ) -> None:
        self.console, self.clock, self.auto_refresh = console, clock, auto_refresh
        self.write = write or console.print
        self.before_live = before_live
        self.model = ProgressModel()
        self._live: Live | None = None
        self._current: tuple[str, str] | None = None  # (layout, "bringup" | "run") shown
        self._lock = threading.RLock()

    def emit(self, event: Event) -> None:
        with self._lock:
            if isinstance(event, Message):
                if self._live is not None:
                    self._live.console.print(Text(event.text))
                else:
                    self.write(event.text)
                return
            self.model.apply(event)
            if isinstance(event, LogLine):
                self._log_line(event)
                return
            if isinstance(event, LayoutDone) and self.model.layout(event.layout).run is None:
                self.pause()  # nothing was measured: a line saying why, no empty bar
                self.write(done_line(None, event))
                return
            phase = "bringup" if isinstance(event, NodeChanged | NodeLog | BringUpDone) else "run"
            self._show(event.layout, phase)
            if isinstance(event, BringUpDone | LayoutDone):
                self.pause()

    def _log_line(self, event: LogLine) -> None:
        """Under the layout's bar while it is measured (the model keeps the recent lines);
        otherwise (a line read as the run ends) printed, never starting a live area."""
        if self._current == (event.layout, "run") and self._live is not None:
            if not self.auto_refresh:
                self._live.refresh()
        elif self._live is not None:
            self._live.console.print(Text(run_log_line(event)))
        else:
            self.write(run_log_line(event))

    def pause(self) -> None:
        """Stop the live area, leaving its last frame on the screen (pytest is about to
        write, or the phase ended)."""
        with self._lock:
            if self._live is not None:
                self._live.refresh()
                self._live.stop()
                self._live, self._current = None, None

    def close(self) -> None:
        self.pause()

    def _show(self, layout: str, phase: str) -> None:
        if self._current != (layout, phase):
            self.pause()
        if self._live is None:
            self.before_live()
            self._live = Live(
                _Frame(self, layout, phase),
                console=self.console,
                auto_refresh=self.auto_refresh,
                refresh_per_second=REFRESH_PER_S,
                redirect_stdout=False,  # pytest captures the test's output; leave it alone
                redirect_stderr=False,
                transient=False,
            )
            self._live.start()
            self._current = (layout, phase)
        elif not self.auto_refresh:
            self._live.refresh()

    def frame(self, layout: str, phase: str) -> RenderableType:
        """What the live area shows now for ``layout`` in ``phase``."""
        view = self.model.layout(layout)
        now = self.clock()
        if phase == "bringup":
            return node_table(view, now)
        lines = recent_log_lines(view)
        return Group(run_bar(view, now), *lines) if lines else run_bar(view, now)


class _Frame:
    """Re-rendered on every refresh, so the elapsed columns move between events."""

    def __init__(self, display: LiveProgress, layout: str, phase: str) -> None:
        self.display, self.layout, self.phase = display, layout, phase

    def __rich__(self) -> RenderableType:
        # no lock: the refresh thread renders this while ``pause`` may be joining it; the
        # model's fields are read whole (list copies), so a frame is at worst one event old
        return self.display.frame(self.layout, self.phase)


def node_table(view: LayoutView, now: float) -> Table:
    """One row per process: node, what it is, state, seconds since launch."""
    rows = list(view.nodes.values())  # a copy: the run's thread may add a row meanwhile
    ready = sum(1 for r in rows if r.state == "ready")
    table = Table(
        title=Text(f"[kimi {view.name}] bring-up: {ready}/{len(rows)} ready"),  # no markup
        title_justify="left",
        expand=False,
    )
    for column in ("node", "process", "role", "state", "elapsed"):
        table.add_column(column, justify="right" if column == "elapsed" else "left")
    for row in rows:
        state = Text(row.state, style=STATE_STYLES.get(row.state, ""))
        table.add_row(row.node, row.name, _role(row), state, f"{row.elapsed(now):.1f}s")
    return table


def _role(row: NodeRow) -> str:
    if row.role == "router":
        return "router"
    parts = [row.role]
    if row.replica is not None:
        parts.append(f"replica {row.replica}")
    if row.rank is not None:
        parts.append(f"rank {row.rank}")
    return " ".join(parts)


def run_bar(view: LayoutView, now: float) -> RenderableType:
    """``[kimi wide] ━━━━━━━━━━━━╺━━━━━━━━━━━ 30/60 done · 2 in flight · 1234 out tok/s ·
    12.3s cluster · 0 failed``: one line per layout being measured (elapsed and tokens/s in
    cluster time)."""
    run = view.run
    if run is None:
        return Text(f"[kimi {view.name}] waiting for the first request")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True, overflow="ellipsis")
    bar = ProgressBar(run.total, run.done, width=BAR_WIDTH)
    grid.add_row(Text(f"[kimi {view.name}]"), bar, _figures(run, now))
    if not run.error:
        return grid
    return Group(grid, Text(f"  stopped: {run.error.splitlines()[0]}", style="red"))


def recent_log_lines(view: LayoutView) -> list[Text]:
    """The measured run's latest log lines (``logs.tail_report_s``), one row each, dimmed:
    ``  log replica0-node0-n1 (n1): Decode batch. #running-req: 3 ...``."""
    rows = []
    for event in view.log_lines:  # the model swaps the list whole: this one stays as read
        text = Text(f"  log {event.name} ({event.node}): {event.line}", style="dim")
        text.no_wrap, text.overflow = True, "ellipsis"
        rows.append(text)
    return rows


def _figures(run: RunRow, now: float) -> Text:
    """``30/60 done · 2 in flight · 1234 out tok/s · 12.3s cluster · 0 failed``"""
    text = Text(f"{run.done}/{run.total} done · {run.in_flight} in flight · ")
    text.append(f"{rate_text(run.tokens_per_s(now))} out tok/s · ")
    text.append(f"{run.cluster_elapsed_s(now):.1f}s cluster · ")
    text.append(f"{run.failed} failed", style="red" if run.failed else "")
    return text
