"""Each process's last log line while a layout is measured, so a long run is not silent.

Bring-up reports every process's last log line (:mod:`pytest_kimi.deploy.startup`); once the
deployment is measured the terminal showed only the request counts, so a replica that stopped
decoding, or a router that logs errors, went unseen until the summary. :class:`RunTails` reads
each process's last log line every ``interval_s`` (``logs.tail_report_s``) on a thread of its
own and reports the lines that CHANGED since the previous round: a quiet process says nothing,
so the plain output is not flooded. The first round only notes where each log stands, so what
is reported was written during the measured run.

Reading never breaks the run: a log that cannot be read this round (an SSH node that blips) is
skipped and tried again next round; a thread that fails says so in the layout's notes. Lines are
shown as written, less terminal escapes (the router colours its log) and control characters;
nothing is added to them.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kimi.deploy.executor import Executor, Handle
    from pytest_kimi.results.events import Progress
    from pytest_kimi.results.layout import LayoutResult

MAX_CHARS = 160
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")
_UNREADABLE = "(log unavailable"  # what the SSH executor's log_tail answers for a lost node

Emit = Callable[["Handle", str], None]  # (process, its new last line)


def last_line(tail: str, max_chars: int = MAX_CHARS) -> str:
    """The last non-empty line of ``tail`` without terminal escapes, at most ``max_chars``."""
    lines = [clean for line in tail.splitlines() if (clean := _ESCAPES.sub("", line).strip())]
    last = lines[-1] if lines else ""
    return last if len(last) <= max_chars else last[: max_chars - 3] + "..."


class ChangedLines:
    """Remembers each process's last reported line; says which lines are news."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def changed(self, name: str, line: str) -> bool:
        """True (and remembered) when ``line`` differs from what ``name`` last had; an empty
        line is never news (a log not written yet)."""
        if not line or self.seen.get(name) == line:
            return False
        self.seen[name] = line
        return True

    def note(self, name: str, line: str) -> None:
        """Remember ``line`` without reporting it (where the log stood at the start)."""
        self.seen[name] = line


class RunTails:
    """Every ``interval_s`` wall seconds, ``emit`` each process whose last log line changed."""

    def __init__(
        self,
        executor: Executor,
        handles: Sequence[Handle],
        emit: Emit,
        *,
        interval_s: float,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self.executor, self.handles, self.emit = executor, list(handles), emit
        self.interval_s, self.max_chars = interval_s, max_chars
        self.lines = ChangedLines()
        self.rounds = 0
        self.crashed = ""  # why the thread stopped early (empty: it did not)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kimi-run-tails", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread to stop and wait (bounded: an SSH read may be retrying)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def notes(self) -> list[str]:
        if self.crashed:
            return [f"log tails: stopped early, no more log lines were shown: {self.crashed}"]
        return []

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.round(report=False)
            while not self._stop.wait(self.interval_s):
                self.round()
        except Exception as exc:  # the run goes on without log lines; the notes say so
            self.crashed = f"{type(exc).__name__}: {exc}"

    def round(self, report: bool = True) -> list[tuple[Handle, str]]:
        """Read every log once; emit (when ``report``) and return the changed lines."""
        self.rounds += 1
        news = []
        for handle in self.handles:
            if self._stop.is_set():
                break
            line = self.read(handle)
            if line is None:
                continue
            if not report:
                self.lines.note(handle.spec.name, line)
            elif self.lines.changed(handle.spec.name, line):
                news.append((handle, line))
                self.emit(handle, line)
        return news

    def read(self, handle: Handle) -> str | None:
        """The log's last line, or None when it cannot be read now (skipped this round)."""
        try:
            tail = self.executor.log_tail(handle, 3)
        except Exception:
            return None
        if tail.lstrip().startswith(_UNREADABLE):
            return None
        return last_line(tail, self.max_chars)


def log_lines(
    executor: Executor,
    handles: Sequence[Handle],
    layout: str,
    progress: Progress,
    interval_s: float,
) -> RunTails | None:
    """A deployment's :class:`RunTails` sending :class:`~pytest_kimi.results.events.LogLine`
    events of ``layout`` to ``progress`` (None when ``interval_s``, ``logs.tail_report_s``, is
    0: no log lines during the run)."""
    from pytest_kimi.results.events import LogLine

    if interval_s <= 0:
        return None

    def emit(handle: Handle, line: str) -> None:
        progress.emit(LogLine(layout, handle.spec.name, handle.spec.node.name, line))

    return RunTails(executor, handles, emit, interval_s=interval_s)


@contextlib.contextmanager
def tailing(tails: RunTails | None, result: LayoutResult) -> Iterator[RunTails | None]:
    """Report log lines while inside; on the way out stop the thread and note a crash."""
    if tails is None:
        yield None
        return
    tails.start()
    try:
        yield tails
    finally:
        tails.stop()
        result.notes.extend(tails.notes())
