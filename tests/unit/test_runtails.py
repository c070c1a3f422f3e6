"""Log lines during the measured run: which lines are news, reading that never breaks the
run, and how plain and live progress show them (fake executor, scripted events; nothing waits
on a clock)."""

from __future__ import annotations

import threading
from pathlib import Path

from rich.console import Console

from pytest_kimi.config import Node
from pytest_kimi.deploy.executor import Handle
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.runtails import ChangedLines, RunTails, last_line, log_lines, tailing
from pytest_kimi.results.events import LayoutDone, LogLine, MeasureStarted, NoProgress
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.run.progress.live import LiveProgress
from pytest_kimi.run.progress.model import RECENT_LOG_LINES, ProgressModel
from pytest_kimi.run.progress.plain import PlainProgress


def _handle(name: str, node: str, role: str = "server") -> Handle:
    spec = ProcessSpec(
        name=name, node=Node(name=node, host=f"{node}.lan", gpus=8), role=role,
        replica=0 if role == "server" else None, rank=0 if role == "server" else None,
        argv=("sleep",), port=30000,
    )  # fmt: skip
    return Handle(spec, 100, Path(f"/logs/{name}.log"))


SERVER = _handle("replica0-node0-node601", "node601")
ROUTER = _handle("router", "node601", role="router")


class FakeExecutor:
    """Each process's log text set by the test; ``failing`` ones raise, ``lost`` ones answer
    the way the SSH executor does for a node that is gone."""

    def __init__(self) -> None:
        self.logs: dict[str, str] = {}
        self.failing: set[str] = set()
        self.lost: set[str] = set()

    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        name = handle.spec.name
        if name in self.failing:
            raise OSError("node601: connection reset")
        if name in self.lost:
            return "(log unavailable: node601 did not answer)"
        return "\n".join(self.logs.get(name, "").splitlines()[-lines:])


def _tails(executor: FakeExecutor) -> tuple[RunTails, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    tails = RunTails(executor, [SERVER, ROUTER], lambda h, line: seen.append((h.spec.name, line)),
                     interval_s=60)  # fmt: skip
    return tails, seen


def test_last_line_is_the_last_written_without_escapes_and_truncated():
    assert last_line("one\ntwo\n\n  \n") == "two"
    assert last_line("") == ""
    router = "\x1b[2m2026-12-04 06:54:03\x1b[0m \x1b[32m INFO\x1b[0m \x1b[1mhttp_request\x1b[0m"
    assert last_line(router) == "2026-12-04 06:54:03  INFO http_request"
    long = last_line("x" * 500)
    assert len(long) == 160 and long.endswith("...")
    assert last_line("abcdef", max_chars=5) == "ab..."


def test_changed_lines_reports_only_news():
    lines = ChangedLines()
    lines.note("a", "loaded")
    assert not lines.changed("a", "loaded")  # where it stood at the start: not news
    assert lines.changed("a", "Decode batch. #running-req: 2")
    assert not lines.changed("a", "Decode batch. #running-req: 2")  # quiet since
    assert lines.changed("b", "first words")  # never seen: news
    assert not lines.changed("c", "")  # nothing written yet
    assert lines.changed("a", "loaded")  # back to an earlier text is still a change


def test_rounds_report_what_was_written_since_the_previous_one():
    executor = FakeExecutor()
    executor.logs = {SERVER.spec.name: "Load weight end.\n", "router": "ready\n"}
    tails, seen = _tails(executor)
    assert tails.round(report=False) == [] and seen == []  # the start: noted, not shown
    executor.logs[SERVER.spec.name] += "Decode batch. #running-req: 3, gen throughput: 41.2\n"
    tails.round()
    assert seen == [(SERVER.spec.name, "Decode batch. #running-req: 3, gen throughput: 41.2")]
    tails.round()  # nothing new anywhere
    assert len(seen) == 1
    executor.logs["router"] += "POST /generate 200\n"
    news = tails.round()
    assert [(h.spec.name, line) for h, line in news] == [("router", "POST /generate 200")]
    assert seen[-1] == ("router", "POST /generate 200")


def test_a_log_that_cannot_be_read_is_skipped_this_round_and_read_the_next():
    executor = FakeExecutor()
    executor.logs = {SERVER.spec.name: "a\n", "router": "r\n"}
    tails, seen = _tails(executor)
    tails.round(report=False)
    executor.logs[SERVER.spec.name] += "b\n"
    executor.logs["router"] += "s\n"
    executor.failing, executor.lost = {SERVER.spec.name}, {"router"}
    assert tails.round() == [] and seen == []  # a blip: nothing shown, nothing raised
    executor.failing, executor.lost = set(), set()
    tails.round()
    assert seen == [(SERVER.spec.name, "b"), ("router", "s")]


def test_the_thread_reports_and_stops_and_a_crash_becomes_a_note():
    executor = FakeExecutor()
    executor.logs = {SERVER.spec.name: "a\n"}
    reported = threading.Event()

    def emit(handle: Handle, line: str) -> None:
        reported.set()
        raise RuntimeError("display broke")

    tails = RunTails(executor, [SERVER], emit, interval_s=0.01)
    result = LayoutResult(name="tp32", label="TP32")
    with tailing(tails, result):
        executor.logs[SERVER.spec.name] += "b\n"
        assert reported.wait(30)
    assert tails.crashed == "RuntimeError: display broke"
    assert result.notes == [
        "log tails: stopped early, no more log lines were shown: RuntimeError: display broke"
    ]


def test_zero_turns_log_lines_off():
    assert log_lines(FakeExecutor(), [SERVER], "tp32", NoProgress(), 0) is None
    result = LayoutResult(name="tp32", label="TP32")
    with tailing(None, result) as tails:
        assert tails is None
    assert result.notes == []


def test_log_lines_emits_progress_events_naming_process_and_node():
    events: list = []

    class Collect(NoProgress):
        def emit(self, event) -> None:
            events.append(event)

    executor = FakeExecutor()
    executor.logs = {"router": "a\n"}
    tails = log_lines(executor, [ROUTER], "tp32", Collect(), 5)
    assert tails is not None
    executor.logs["router"] += "b\n"
    tails.round()
    [event] = events
    assert isinstance(event, LogLine)
    assert (event.layout, event.name, event.node, event.line) == ("tp32", "router", "node601", "b")


# -- rendering ---------------------------------------------------------------------------------
def _line(text: str, at: float = 12.0, name: str = "replica0-node0-node601") -> LogLine:
    return LogLine("tp32", name, "node601", text, at=at)


def test_plain_prints_one_prefixed_line_and_off_prints_none():
    out: list[str] = []
    PlainProgress(out.append).emit(_line("Decode batch. #running-req: 3"))
    assert out == [
        "[kimi tp32] log replica0-node0-node601 (node601): Decode batch. #running-req: 3"
    ]
    silent: list[str] = []
    PlainProgress(silent.append, events=False).emit(_line("Decode batch"))
    assert silent == []


def test_model_keeps_the_latest_lines():
    model = ProgressModel()
    for i in range(RECENT_LOG_LINES + 2):
        model.apply(_line(f"line {i}"))
    kept = [e.line for e in model.layout("tp32").log_lines]
    assert kept == [f"line {i}" for i in range(2, RECENT_LOG_LINES + 2)]


def test_live_shows_lines_under_the_bar_while_measured_and_prints_them_otherwise():
    console = Console(record=True, force_terminal=True, width=120, color_system=None)
    written: list[str] = []
    display = LiveProgress(console, write=written.append, clock=lambda: 12.0, auto_refresh=False)
    display.emit(_line("before the run", at=8.0))  # no live area: a line, none started
    assert display._live is None
    assert written == ["[kimi tp32] log replica0-node0-node601 (node601): before the run"]
    display.emit(MeasureStarted("tp32", 10, at=9.0))
    display.emit(_line("Decode batch. #running-req: 3", at=10.0))
    display.emit(_line("POST /generate 200", at=11.0, name="router"))
    frame = console.export_text(clear=True)
    assert "0/10 done" in frame
    assert "  log replica0-node0-node601 (node601): Decode batch. #running-req: 3" in frame
    assert "  log router (node601): POST /generate 200" in frame
    display.emit(LayoutDone("tp32", at=13.0))
    assert display._live is None
    display.emit(_line("shut down", at=14.0))  # after the run: printed, no new live area
    assert display._live is None
    assert written[-1] == "[kimi tp32] log replica0-node0-node601 (node601): shut down"
