"""Which progress display a pytest session gets, and the glue that keeps it out of pytest's
way. Standard library and pytest only (rich is imported only when the live display is chosen).

``--kimi-progress=auto`` (the default) draws the live display when pytest's output is a
terminal, not under xdist (workers' output is not a terminal; the controller runs no layout)
and not with ``-qq``; otherwise plain lines. ``live`` and ``plain`` force one; ``off`` prints
only what the run has to say (no progress).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

import pytest

if TYPE_CHECKING:
    from pytest_kimi.results.events import Progress

MODES = ("auto", "live", "plain", "off")


def choose(mode: str, *, isatty: bool, xdist: bool, verbosity: int, dumb: bool) -> str:
    """``live``, ``plain`` or ``off`` for the ``--kimi-progress`` value and the session."""
    if mode != "auto":
        return mode
    return "live" if isatty and not xdist and not dumb and verbosity > -2 else "plain"


def requested(config: pytest.Config) -> str:
    """``--kimi-progress``, else the ``kimi_progress`` ini key, else ``auto``."""
    mode = config.getoption("kimi_progress") or config.getini("kimi_progress") or "auto"
    if mode not in MODES:
        raise pytest.UsageError(f"kimi_progress = {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def under_xdist(config: pytest.Config) -> bool:
    """A worker, or a controller running with ``-n`` > 0 (``-n 0`` runs in-process)."""
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    workers = getattr(config.option, "numprocesses", None)
    return bool(workers) and getattr(config.option, "dist", "no") != "no"


@contextlib.contextmanager
def uncaptured(config: pytest.Config) -> Iterator[None]:
    """pytest's real stdout for the duration (global and fixture capture suspended)."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


def line_writer(config: pytest.Config) -> Callable[[str], None]:
    """Lines through pytest's terminal reporter, reaching the terminal even while output is
    captured; nothing without a terminal reporter (``-p no:terminal``)."""

    def write(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            with uncaptured(config):
                reporter.write_line(line)

    return write


def display_for(config: pytest.Config) -> Progress:
    """The session's display, registered so pytest's own output pauses a live one."""
    from pytest_kimi.run.progress.plain import PlainProgress

    write = line_writer(config)
    # this may run before the terminal reporter is registered (pytest_configure): ask
    # whether it is blocked, not whether it is there yet
    shown = not config.pluginmanager.is_blocked("terminal")
    with uncaptured(config):
        isatty = os.isatty(1)
    mode = choose(
        requested(config),
        isatty=isatty,
        xdist=under_xdist(config),
        verbosity=config.get_verbosity(),
        dumb=os.environ.get("TERM") == "dumb",
    )
    if mode == "off" or not shown:
        return PlainProgress(write, events=False)
    if mode == "plain":
        return PlainProgress(write)
    display, stream = _live(config, write)
    config.pluginmanager.register(PauseLive(display, stream.close), "kimi-progress-live")
    return display


def _live(config: pytest.Config, write: Callable[[str], None]) -> tuple[Progress, TextIO]:
    """A live display on a duplicate of the real stdout, so it reaches the terminal whatever
    pytest's capture does with fd 1 meanwhile."""
    from rich.console import Console

    from pytest_kimi.run.progress.live import LiveProgress

    with uncaptured(config):
        fd = os.dup(1)
    stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace")
    console = Console(file=stream, force_terminal=True, width=terminal_width(fd))

    def end_pytest_line() -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            with uncaptured(config):
                reporter.ensure_newline()
                reporter.flush()

    return LiveProgress(console, write=write, before_live=end_pytest_line), stream


def terminal_width(fd: int, default: int = 100) -> int:
    """``COLUMNS`` if set, else the terminal's width, else ``default`` (a pseudo-terminal
    nobody sized reports 0 columns)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(fd).columns
        except OSError:
            columns = 0
    return columns if columns > 0 else default


class PauseLive:
    """pytest hooks: stop the live area before pytest reports anything (a failed fixture, a
    test's outcome), and for good at the end of the session."""

    def __init__(self, display: Progress, release: Callable[[], None]) -> None:
        self.display, self.release = display, release

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.display.pause()  # type: ignore[attr-defined]

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self) -> None:
        self.display.close()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        self.display.close()

    def pytest_unconfigure(self) -> None:
        self.display.close()
        self.release()  # the duplicate of stdout
