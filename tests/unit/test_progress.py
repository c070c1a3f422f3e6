"""Progress events -> model -> plain lines and the live (rich) display, from scripted events
(every time is an event's ``at`` or a fake clock: nothing waits, nothing is timed)."""

from __future__ import annotations

import pytest
from rich.console import Console

from pytest_kimi.results.events import (
    BringUpDone,
    LayoutDone,
    MeasureStarted,
    Message,
    NodeChanged,
    RequestFinished,
    RequestStarted,
)
from pytest_kimi.run.progress.live import LiveProgress
from pytest_kimi.run.progress.model import ProgressModel
from pytest_kimi.run.progress.plain import PlainProgress
from pytest_kimi.run.progress.terminal import choose, terminal_width


def bringup(layout: str = "wide") -> list:
    """Two servers of one replica and a router: launched, healthy, router ready, warm."""
    server = {"layout": layout, "role": "server", "replica": 0}
    return [
        NodeChanged(name="r0-rank0", node="n1", rank=0, state="starting", at=0.0, **server),
        NodeChanged(name="r0-rank1", node="n2", rank=1, state="starting", at=0.5, **server),
        NodeChanged(name="r0-rank0", node="n1", rank=0, state="healthy", at=3.0, **server),
        NodeChanged(name="r0-rank1", node="n2", rank=1, state="healthy", at=3.0, **server),
        NodeChanged(layout, "router", "n1", "router", None, None, "starting", at=3.5),
        NodeChanged(layout, "router", "n1", "router", None, None, "ready", "http://r:1", at=4.25),
        BringUpDone(layout, at=5.0),
    ]


def measuring(layout: str = "wide", total: int = 20) -> list:
    """``total`` requests, two at a time, 1 wall second each at time scale 40; every fifth
    fails; each finished one carried 100 output tokens."""
    events: list = [MeasureStarted(layout, total, time_scale=40.0, at=9.0)]
    for i in range(0, total, 2):
        t = 10.0 + i / 2
        pair = range(i, min(i + 2, total))
        events += [RequestStarted(layout, at=t) for _ in pair]
        events += [RequestFinished(layout, 100, success=(j + 1) % 5 != 0, at=t + 1) for j in pair]
    return [*events, LayoutDone(layout, at=30.0)]


def lines_of(sequence: list, **kwargs) -> list[str]:
    out: list[str] = []
    display = PlainProgress(out.append, **kwargs)
    for event in sequence:
        display.emit(event)
    return out


def test_model_folds_bringup_and_requests():
    model = ProgressModel()
    for event in bringup()[:4]:
        model.apply(event)
    view = model.layouts["wide"]
    assert [(r.name, r.state) for r in view.nodes.values()] == [
        ("r0-rank0", "healthy"),
        ("r0-rank1", "healthy"),
    ]
    assert view.nodes["r0-rank1"].elapsed(now=99.0) == 2.5  # launch -> healthy, not -> now
    for event in bringup()[4:]:
        model.apply(event)
    assert {r.state for r in view.nodes.values()} == {"ready"}  # warm: servers ready too
    assert view.bringup_s() == 4.25

    events = measuring(total=4)
    for event in events[:5]:  # MeasureStarted; started, started, finished, finished
        model.apply(event)
    run = view.run
    assert (run.done, run.in_flight, run.failed, run.output_tokens) == (2, 0, 0, 200)
    assert run.started_at == 10.0  # the first send, not MeasureStarted
    assert run.cluster_elapsed_s(now=12.0) == 80.0  # 2 wall s x 40
    assert run.tokens_per_s(now=12.0) == 2.5
    for event in events[5:]:
        model.apply(event)
    assert (run.done, run.failed, run.finished) == (4, 0, True)
    assert run.cluster_elapsed_s(now=1000.0) == 80.0  # ends at the last finish (t=12)


def test_plain_lines_exactly():
    lines = lines_of([Message("[kimi wide] bringing up TP2 x1"), *bringup(), *measuring()])
    assert lines == [
        "[kimi wide] bringing up TP2 x1",
        "[kimi wide] r0-rank0 on n1 healthy after 3.0s",
        "[kimi wide] r0-rank1 on n2 healthy after 2.5s",
        "[kimi wide] router ready at http://r:1 after 4.2s",
        "[kimi wide] measuring 20 requests",
        # every tenth of 20: each pair of requests
        *[
            f"[kimi wide] {n}/20 requests done ({n * 5}%), {1 if n % 2 else 0} in flight, "
            f"{rate:.1f} output tok/s, {elapsed:.1f}s cluster time, {failed} failed"
            for n, rate, elapsed, failed in [
                (2, 5.0, 40.0, 0),
                (4, 5.0, 80.0, 0),
                (6, 5.0, 120.0, 1),
                (8, 5.0, 160.0, 1),
                (10, 5.0, 200.0, 2),
                (12, 5.0, 240.0, 2),
                (14, 5.0, 280.0, 2),
                (16, 5.0, 320.0, 3),
                (18, 5.0, 360.0, 3),
                (20, 5.0, 400.0, 4),
            ]
        ],
        "[kimi wide] measured 20/20 requests in 400.0s cluster time (10.0s wall), "
        "5.0 output tok/s, 4 failed",
    ]


def test_plain_reports_each_request_below_ten_and_failures():
    lines = lines_of([*measuring(total=3)[:-1], LayoutDone("wide", error="boom\nmore", at=30.0)])
    assert [line.split(",")[0] for line in lines[1:4]] == [
        "[kimi wide] 1/3 requests done (33%)",
        "[kimi wide] 2/3 requests done (67%)",
        "[kimi wide] 3/3 requests done (100%)",
    ]
    assert lines[-1].startswith("[kimi wide] stopped after 3/3 requests in ")
    assert lines[-1].endswith(": boom")
    failed = NodeChanged("wide", "r0", "n1", "server", 0, 0, "failed", "exited with code 1\nlog")
    assert lines_of([bringup()[0], failed]) == ["[kimi wide] r0 on n1 failed: exited with code 1"]
    assert lines_of([LayoutDone("wide", error="warm-up failed")]) == [
        "[kimi wide] not measured: warm-up failed"
    ]


def test_off_keeps_messages_only():
    assert lines_of([Message("hello"), *bringup(), *measuring()], events=False) == ["hello"]


def test_live_renders_table_then_bar_and_leaves_the_last_frames():
    console = Console(record=True, force_terminal=True, width=120, color_system=None)
    now = [0.0]
    started: list[str] = []
    display = LiveProgress(
        console,
        write=lambda text: started.append("line:" + text),
        before_live=lambda: started.append("live"),
        clock=lambda: now[0],
        auto_refresh=False,
    )
    display.emit(Message("[kimi wide] bringing up TP2 x1"))  # not live yet: a line
    now[0] = 2.0
    for event in bringup()[:2]:
        display.emit(event)
    assert display._live is not None  # a live area while bring-up runs
    first = console.export_text(clear=True)
    assert "[kimi wide] bring-up: 0/2 ready" in first
    assert "│ n2   │ r0-rank1 │ server replica 0 rank 1 │ starting │    1.5s │" in first
    display.emit(Message("[kimi wide] a note"))  # above the live area
    now[0] = 6.0
    for event in bringup()[2:]:
        display.emit(event)
    assert display._live is None  # warm-up done: the table stays on screen, stopped
    table = console.export_text(clear=True)
    assert "[kimi wide] a note" in table
    assert "[kimi wide] bring-up: 3/3 ready" in table
    assert "│ n1   │ router   │ router                  │ ready │    0.8s │" in table

    events = measuring()
    now[0] = 15.0
    for event in events[:17]:  # MeasureStarted, 4 rounds: 8 started, 8 finished
        display.emit(event)
    running = console.export_text(clear=True)
    # now (15) - first send (10) = 5 wall s = 200 cluster s; 800 tokens in 200 s
    assert "8/20 done · 0 in flight · 4.0 out tok/s · 200.0s cluster · 1 failed" in running
    for event in events[17:]:
        display.emit(event)
    assert display._live is None
    final = console.export_text()
    assert "[kimi wide] ━━━━━━━━━━━━━━━━━━━━━━━━" in final  # a full bar
    assert "20/20 done · 0 in flight · 5.0 out tok/s · 400.0s cluster · 4 failed" in final
    assert started == ["line:[kimi wide] bringing up TP2 x1", "live", "live"]


def test_live_pause_stops_and_next_event_resumes():
    console = Console(record=True, force_terminal=True, width=100, color_system=None)
    display = LiveProgress(console, clock=lambda: 12.0, auto_refresh=False)
    events = measuring()
    display.emit(events[0])
    display.emit(events[1])
    display.pause()  # pytest is about to write
    assert display._live is None
    display.emit(events[2])
    assert display._live is not None
    display.close()
    assert display._live is None
    assert "0/20 done · 2 in flight" in console.export_text()


def test_live_says_why_nothing_was_measured():
    lines: list[str] = []
    console = Console(record=True, force_terminal=True, width=100, color_system=None)
    display = LiveProgress(console, write=lines.append, clock=lambda: 0.0, auto_refresh=False)
    display.emit(LayoutDone("wide", error="warm-up request failed"))
    assert lines == ["[kimi wide] not measured: warm-up request failed"]
    assert display._live is None and console.export_text() == ""


@pytest.mark.parametrize(
    ("mode", "isatty", "xdist", "verbosity", "dumb", "expected"),
    [
        ("auto", True, False, 0, False, "live"),
        ("auto", True, False, -1, False, "live"),  # -q
        ("auto", True, False, -2, False, "plain"),  # -qq
        ("auto", False, False, 0, False, "plain"),  # a pipe, a file, CI
        ("auto", True, True, 0, False, "plain"),  # xdist
        ("auto", True, False, 0, True, "plain"),  # TERM=dumb
        ("live", False, True, 0, False, "live"),
        ("plain", True, False, 0, False, "plain"),
        ("off", True, False, 0, False, "off"),
    ],
)
def test_choose(mode, isatty, xdist, verbosity, dumb, expected):
    assert choose(mode, isatty=isatty, xdist=xdist, verbosity=verbosity, dumb=dumb) == expected


def test_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "133")
    assert terminal_width(-1) == 133
    monkeypatch.delenv("COLUMNS")
    assert terminal_width(-1, default=90) == 90  # not a terminal


def test_bringup_turns_deployment_states_into_events():
    from types import SimpleNamespace

    from pytest_kimi.run.bringup import node_events

    seen: list = []
    sink = SimpleNamespace(emit=seen.append, close=lambda: None)
    spec = SimpleNamespace(name="replica1-node0", node=SimpleNamespace(name="n3"), role="server",
                           replica=1, rank=0)  # fmt: skip
    node_events("deep", sink)(spec, "failed", "exited with code 3")
    [event] = seen
    assert (event.layout, event.name, event.node, event.replica, event.rank) == (
        "deep", "replica1-node0", "n3", 1, 0,
    )  # fmt: skip
    assert (event.state, event.detail) == ("failed", "exited with code 3")
