"""The shared cluster clock (pytest_kimi/workload/sharedclock.py), driven by a fake wall clock:
every reading is computed, never waited for."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys

import pytest

from pytest_kimi.workload import sharedclock as clock_mod
from pytest_kimi.workload.clockfile import SIZE
from pytest_kimi.workload.sharedclock import INF, SharedClock


class Wall:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
def clock(tmp_path, wall) -> SharedClock:
    c = SharedClock.create(tmp_path / "clock", 40, wall)
    yield c
    c.close()


def test_it_runs_at_the_time_scale_and_every_handle_reads_the_same(tmp_path, wall, clock):
    other = SharedClock(tmp_path / "clock", wall)  # another process's handle
    wall.t += 0.5
    assert clock.cluster_now() == other.cluster_now() == pytest.approx(20.0)
    assert clock.now() == pytest.approx(1000.5)  # wall-equivalent: origin + cluster / scale
    other.close()


def test_a_hold_stops_it_for_everyone_until_released(tmp_path, wall, clock):
    other = SharedClock(tmp_path / "clock", wall)
    wall.t += 0.1
    clock.hold(2)
    wall.t += 1.5
    assert other.cluster_now() == pytest.approx(4.0)
    other.release()
    wall.t += 1.0
    assert clock.cluster_now() == pytest.approx(4.0)  # one hold still stands
    clock.release()
    wall.t += 0.1
    assert other.cluster_now() == pytest.approx(8.0)
    stats = clock.stats()
    assert stats.held_wall_s == pytest.approx(2.5) and stats.longest_hold_s == pytest.approx(2.5)
    other.close()


def test_a_release_with_nothing_held_is_a_no_op(wall, clock):
    clock.release(3)
    wall.t += 0.1
    assert clock.cluster_now() == pytest.approx(4.0)


def test_it_never_passes_a_bound_and_resumes_from_it(wall, clock):
    clock.join()
    clock.bound(2.0)
    wall.t += 1.0  # 40 cluster seconds' worth of wall time
    assert clock.cluster_now() == 2.0
    clock.bound(10.0)
    wall.t += 0.1
    assert clock.cluster_now() == pytest.approx(6.0)  # from the old bound, not from 40
    assert clock.stats().bound_wall_s == pytest.approx(0.95)
    clock.bound(INF)
    wall.t += 1.0
    assert clock.cluster_now() == pytest.approx(46.0)


def test_the_earliest_of_several_bounds_holds(tmp_path, wall, clock):
    other = SharedClock(tmp_path / "clock", wall)
    clock.join()
    other.join()
    clock.bound(5.0)
    other.bound(3.0)
    wall.t += 1.0
    assert clock.cluster_now() == 3.0
    other.leave()
    assert clock.cluster_now() == 3.0  # it runs on from where it stood
    wall.t += 1.0
    assert clock.cluster_now() == 5.0
    other.close()


def test_an_arrival_pulls_the_bound_back_and_takes_the_clients_hold(tmp_path, wall, clock):
    engine = SharedClock(tmp_path / "clock", wall)
    engine.join()
    engine.bound(30.0)
    with clock.attach():
        wall.t += 0.25
        clock.hold()  # the client, before it sends
        wall.t += 0.5  # on the wire: no cluster time passes
        assert engine.arrive() == pytest.approx(10.0)
        wall.t += 1.0
        assert clock.cluster_now() == pytest.approx(10.0)  # bounded at the arrival
        engine.bound(30.0)
        wall.t += 0.1
        assert clock.cluster_now() == pytest.approx(14.0)
    engine.close()


def test_engines_hold_for_tokens_only_while_a_client_takes_part(wall, clock):
    assert not clock.hold_if_attached(2)
    assert not clock.held()
    with clock.attach():
        assert clock.hold_if_attached(2)
        assert clock.held()
    assert not clock.held()  # the client left: what it left held is let go


def test_a_hold_nobody_lets_go_is_dropped_and_counted(wall, clock, monkeypatch):
    monkeypatch.setattr(clock_mod.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine
    with clock.attach():
        wall.t += 0.1
        clock.hold()
        wall.t += clock_mod.HOLD_STALL_S - 0.01
        assert clock.cluster_now() == pytest.approx(4.0)
        wall.t += 0.02
        clock.cluster_now()  # the reading that finds it stale drops it
        wall.t += 0.1
        assert clock.cluster_now() == pytest.approx(8.0)
        assert clock.stats().stalls == 1


def test_a_bound_whose_process_died_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(clock_mod, "BOUND_STALL_S", 0.0)  # look at once: no waiting here
    path = tmp_path / "clock"
    clock = SharedClock.create(path, 40)
    code = (
        "import time\nfrom pytest_kimi.workload.sharedclock import SharedClock\n"
        f"c = SharedClock({str(path)!r}); c.join(); c.bound(0.0)\n"
        "print('bound', flush=True)\ntime.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "bound"
        stood = clock.cluster_now()  # at (or already past) its bound: standing still
        assert clock.cluster_now() == stood  # alive: its bound holds
        assert clock.stats().stalls == 0
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        first = clock.cluster_now()  # finds the owner gone, drops the bound
        assert clock.stats().stalls == 1
        while clock.cluster_now() == first:  # and runs again (a microsecond is enough)
            pass
    finally:
        child.kill()
        child.wait()
        clock.close()


def test_a_live_process_bound_stays_however_long(tmp_path, wall, clock):
    clock.join()
    clock.bound(1.0)
    wall.t += 100.0
    assert clock.cluster_now() == 1.0
    assert clock.stats().stalls == 0


def test_not_a_clock_file_is_refused(tmp_path):
    bad = tmp_path / "x"
    bad.write_bytes(b"\0" * SIZE)
    with pytest.raises(ValueError, match="not a mock clock file"):
        SharedClock(bad)


def test_a_bad_scale_is_refused(tmp_path):
    with pytest.raises(ValueError, match="time scale"):
        SharedClock.create(tmp_path / "c", 0)


def test_sleep_until_bounds_the_clock_at_the_target(tmp_path):
    import asyncio

    c = SharedClock.create(tmp_path / "clock", 1000)
    target = c.now() + 0.005
    asyncio.run(c.sleep_until(target))
    # the clock stops at the client's next send, however late this process woke
    assert c.now() == pytest.approx(target, abs=1e-9)
    c.leave()
    assert c.cluster_now() > target * 0  # running again
    assert math.isfinite(c.cluster_now())
    c.close()


def test_a_loaded_machine_lets_a_hold_stand_longer(wall, clock, monkeypatch):
    """At a load of 14 on 2 cores a hold may stand 7 x 2 s before it is taken for lost."""
    monkeypatch.setattr(clock_mod.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(clock_mod.os, "getloadavg", lambda: (14.0, 10.0, 5.0))
    assert clock_mod.hold_stall_s() == pytest.approx(14.0)
    with clock.attach():
        clock.hold()
        wall.t += 13.9
        clock.cluster_now()
        assert clock.held() and clock.stats().stalls == 0
        wall.t += 0.2
        clock.cluster_now()
        assert not clock.held() and clock.stats().stalls == 1
