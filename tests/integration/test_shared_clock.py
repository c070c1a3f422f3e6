"""The shared cluster clock end to end: a mock server and the product's client on one clock.

Truth is the model's own ground truth (``/kimi/ground_truth``: cluster times the scheduler
computed), which the client cannot influence. On wall time a slow client's turnaround lands
in cluster time multiplied by the time scale; on the shared clock it must not land at all."""

from __future__ import annotations

import asyncio
import itertools
import time

import httpx
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.testing.processes import mock_argv
from pytest_kimi.workload import client as client_module
from pytest_kimi.workload import sessionsend
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
from pytest_kimi.workload.sessions import Session, ThinkTime
from pytest_kimi.workload.sharedclock import SharedClock
from pytest_kimi.workload.slots import Slots
from pytest_kimi.workload.specs import arrival_gaps

PROMPT = " ".join(["bago"] * 64)
SCALE = 1000.0  # a wall millisecond is a cluster second


def _serve(spawn, clock_path) -> str:
    port = free_port()
    flags = ["--tp-size", "8", "--mock-time-scale", f"{SCALE:g}", "--mock-clock", str(clock_path)]
    proc = spawn(mock_argv(port, *flags), "mock")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return url


def _slow_client(record) -> None:
    """Blocks the client's loop 20 ms after each request: 20 cluster seconds at 1:1000."""
    time.sleep(0.02)


@pytest.mark.parametrize("api", ["generate", "chat"])
def test_a_slow_client_costs_no_cluster_time(spawn, tmp_path, api):
    clock = SharedClock.create(tmp_path / "clock", SCALE)
    url = _serve(spawn, tmp_path / "clock")
    specs = [RequestSpec(f"p{i}", PROMPT, 64) for i in range(6)]
    options = ClientOptions(api=api, output_len=8, concurrency=2)
    records = asyncio.run(run_requests(url, specs, options, on_done=_slow_client, clock=clock))
    truth = {t["rid"]: t for t in httpx.get(url + "/kimi/ground_truth").json()["requests"]}
    assert len(records) == 6 and all(r.success for r in records), [r.error for r in records]
    for r in records:
        t = truth[r.request_id.removeprefix("chatcmpl-").removeprefix("cmpl-")]
        # what the client measured, in cluster time, is what the model did
        assert (r.first_token_time - r.send_time) * SCALE == pytest.approx(
            t["first_token"] - t["arrival"], abs=1e-6
        )
        assert (r.end_time - r.send_time) * SCALE == pytest.approx(
            t["finished"] - t["arrival"], abs=1e-6
        )
    # closed loop: each follow-up arrived at the very cluster time a request finished
    finishes = [t["finished"] for t in truth.values()]
    follow_ups = sorted(t["arrival"] for t in truth.values())[options.concurrency :]
    for arrival in follow_ups:
        assert min(abs(arrival - f) for f in finishes) < 1e-9, (arrival, sorted(finishes))
    stats = clock.stats()
    assert stats.stalls == 0
    assert stats.held_wall_s >= 6 * 0.02  # the slow client's time: counted, not in the figures
    clock.close()


def _slots_entered_late(clock: SharedClock):
    """Slots whose every entry after the first waits until the first request has reached the
    engine and then blocks the client 20 ms (20 cluster seconds at 1:1000): a client switched
    out between two requests of one instant, driven rather than hoped for."""
    entries = itertools.count()

    class LateSlots(Slots):
        async def enter(self) -> None:
            if next(entries) > 0:
                while clock.taken() < 1:
                    await asyncio.sleep(0.001)
                time.sleep(0.02)
            await super().enter()

    return LateSlots


@pytest.mark.parametrize("work", ["requests", "sessions"])
def test_a_closed_loops_first_requests_arrive_at_one_instant_however_late_the_client(
    spawn, tmp_path, monkeypatch, work
):
    """The first ``concurrency`` requests (or sessions' first turns) of a closed loop go out
    at one cluster instant, even when the first has reached its engine before the client
    got to the second: the run holds the clock until each holds its own (``Burst``). Without
    that hold the clock ran while the client was busy, and a loaded machine spread the
    burst over cluster time (the live mock then drifted 2% from its twin)."""
    clock = SharedClock.create(tmp_path / "clock", SCALE)
    url = _serve(spawn, tmp_path / "clock")
    late = _slots_entered_late(clock)
    monkeypatch.setattr(client_module, "Slots", late)
    monkeypatch.setattr(sessionsend, "Slots", late)
    options = ClientOptions(api="chat", output_len=4, concurrency=3)
    if work == "requests":
        items: list = [RequestSpec(f"p{i}", PROMPT, 64) for i in range(3)]
    else:
        items = [Session(f"s{i}", (PROMPT,)) for i in range(3)]
    records = asyncio.run(run_requests(url, items, options, clock=clock))
    assert len(records) == 3 and all(r.success for r in records), [r.error for r in records]
    arrivals = [t["arrival"] for t in httpx.get(url + "/kimi/ground_truth").json()["requests"]]
    assert len(arrivals) == 3 and max(arrivals) - min(arrivals) < 1e-9, arrivals
    assert {r.send_time for r in records} == {records[0].send_time}
    assert clock.stats().held_wall_s >= 2 * 0.02  # the client's time: counted, not in figures
    clock.close()


def test_without_the_shared_clock_the_same_client_turnaround_lands_in_cluster_time(spawn):
    """The control: the same slow client on wall time. Follow-ups arrive 20 cluster seconds
    (the client's 20 ms times 1:1000) after the finish that freed their slot, or later."""
    port = free_port()
    proc = spawn(mock_argv(port, "--tp-size", "8", "--mock-time-scale", f"{SCALE:g}"), "mock")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    specs = [RequestSpec(f"p{i}", PROMPT, 64) for i in range(4)]
    records = asyncio.run(
        run_requests(url, specs, ClientOptions(output_len=8, concurrency=1), on_done=_slow_client)
    )
    assert all(r.success for r in records)
    truth = sorted(
        httpx.get(url + "/kimi/ground_truth").json()["requests"], key=lambda t: t["arrival"]
    )
    gaps = [b["arrival"] - a["finished"] for a, b in itertools.pairwise(truth)]
    assert min(gaps) >= 20.0, gaps


def test_open_loop_arrivals_land_at_their_scheduled_cluster_times(spawn, tmp_path):
    """A finite request rate: the client bounds the clock at each scheduled send, so however
    late its process wakes, requests arrive exactly on the Poisson schedule; after the last
    send the clock runs on (the run ends rather than waiting at the last send)."""
    clock = SharedClock.create(tmp_path / "clock", SCALE)
    url = _serve(spawn, tmp_path / "clock")
    specs = [RequestSpec(f"p{i}", PROMPT, 64) for i in range(5)]
    rate = 200.0  # requests per client second: 0.2 per cluster second at 1:1000
    options = ClientOptions(output_len=4, concurrency=5, request_rate=rate, seed=3)
    records = asyncio.run(run_requests(url, specs, options, on_done=_slow_client, clock=clock))
    assert all(r.success for r in records), [r.error for r in records]
    truth = sorted(
        httpx.get(url + "/kimi/ground_truth").json()["requests"], key=lambda t: t["arrival"]
    )
    gaps = [b["arrival"] - a["arrival"] for a, b in itertools.pairwise(truth)]
    expected = [g * SCALE for g in arrival_gaps(len(specs), rate, 3)[:-1]]
    assert gaps == pytest.approx(expected, abs=1e-6)
    # each record keeps its scheduled instant on the run's clock, and left at it: the
    # shared clock is bounded at each send, so no request is late in cluster time
    planned = [b.intended_time - a.intended_time for a, b in itertools.pairwise(records)]
    assert planned == pytest.approx(arrival_gaps(len(specs), rate, 3)[:-1], abs=1e-9)
    assert all(0 <= r.dispatch_delay * SCALE < 1e-3 for r in records)
    assert clock.stats().stalls == 0
    clock.close()


@pytest.mark.parametrize("think_s", [0.0, 5.0])
def test_a_sessions_next_turn_arrives_its_think_time_after_the_answer_in_cluster_time(
    spawn, tmp_path, think_s
):
    """Sessions on the shared clock: each later turn reaches the model exactly its think
    time (cluster seconds) after the model finished the turn before, however slow the
    client; a session's slot goes to the next session at the instant its last turn ends."""
    clock = SharedClock.create(tmp_path / "clock", SCALE)
    url = _serve(spawn, tmp_path / "clock")
    sessions = [Session(f"s{i}", (PROMPT, "bago bago", "bago"), system="bago " * 32)
                for i in range(3)]  # fmt: skip
    options = ClientOptions(api="chat", output_len=8, concurrency=2,
                            think_time=ThinkTime(think_s / SCALE))  # fmt: skip
    records = asyncio.run(run_requests(url, sessions, options, on_done=_slow_client,
                                       clock=clock))  # fmt: skip
    assert len(records) == 9 and all(r.success for r in records), [r.error for r in records]
    truth = {t["rid"]: t for t in httpx.get(url + "/kimi/ground_truth").json()["requests"]}
    model = {(r.session_id, r.turn): truth[r.request_id.removeprefix("chatcmpl-")]
             for r in records}  # fmt: skip
    for session in sessions:
        for k in (1, 2):
            after, before = model[(session.id, k)], model[(session.id, k - 1)]
            assert after["arrival"] == pytest.approx(before["finished"] + think_s, abs=1e-6)
    # the third session started when the first of the others ended its last turn
    ends = sorted(model[(s.id, 2)]["finished"] for s in sessions[:2])
    assert model[("s2", 0)]["arrival"] == pytest.approx(ends[0], abs=1e-6)


def test_sessions_with_an_arrival_list_start_at_their_instants(spawn, tmp_path):
    """Sessions timed by an arrival list (``Session.start_s``: ``arrivals:`` in the cluster
    file) start open loop at their own instants in cluster time, however slow the client,
    not in a closed loop: the third starts on time though the first two are still running."""
    from dataclasses import replace

    clock = SharedClock.create(tmp_path / "clock", SCALE)
    url = _serve(spawn, tmp_path / "clock")
    starts = [0.0, 3.0, 3.0, 10.0]  # cluster seconds
    sessions = [replace(Session(f"s{i}", (PROMPT, "bago bago")), start_s=t / SCALE)
                for i, t in enumerate(starts)]  # fmt: skip
    options = ClientOptions(api="chat", output_len=8, concurrency=4,
                            think_time=ThinkTime(1.0 / SCALE))  # fmt: skip
    records = asyncio.run(run_requests(url, sessions, options, on_done=_slow_client,
                                       clock=clock))  # fmt: skip
    assert len(records) == 8 and all(r.success for r in records), [r.error for r in records]
    truth = {t["rid"]: t for t in httpx.get(url + "/kimi/ground_truth").json()["requests"]}
    first = {r.session_id: truth[r.request_id.removeprefix("chatcmpl-")]["arrival"]
             for r in records if r.turn == 0}  # fmt: skip
    origin = first["s0"]
    assert [first[s.id] - origin for s in sessions] == pytest.approx(starts, abs=1e-6)
    assert clock.stats().stalls == 0
    clock.close()
