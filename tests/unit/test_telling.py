"""``ReplicaSim.next_telling_time``: the shared clock may run up to it while the engine is
behind, so no request's first or last token may ever come out before it."""

from __future__ import annotations

import pytest

from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.scheduler import ReplicaSim


def _check(sim: ReplicaSim, arrivals: list[tuple[float, int, int]]) -> int:
    """Step the sim event by event. The telling time computed at any point is where the clock
    may already stand while the engine has not caught up, so every first or last token that
    comes out afterwards must be at or after every telling time computed since the last
    arrival (an arrival comes with the clock at its time, as on a live engine)."""
    pending = sorted(arrivals)
    floor, told, checked = 0.0, 0, 0
    while True:
        nxt = sim.next_event_time()
        if pending and (nxt is None or pending[0][0] <= nxt):
            at, prompt, new = pending.pop(0)
            for event in sim.advance(at):
                checked += _told(event, floor)
            sim.add(f"r{told}", prompt, new, at)
            floor, told = at, told + 1
            continue
        if nxt is None:
            return checked
        floor = max(floor, sim.next_telling_time())
        for event in sim.advance(nxt):
            checked += _told(event, floor)


def _told(event, floor: float) -> int:
    if event.generated == 1 or event.finished:
        assert event.time >= floor - 1e-12, (event, floor)
        return 1
    return 0


@pytest.mark.parametrize(("tp", "pp", "jitter"), [(32, 1, 0.0), (4, 8, 0.0), (8, 4, 0.05)])
def test_no_first_or_last_token_comes_before_the_telling_time(tp, pp, jitter):
    profile = Profile(jitter=jitter)
    sim = ReplicaSim(CostModel(profile, tp=tp, pp=pp, ep=4, gpus_per_node=8),
                     chunk_size=8192, max_running=256, seed=3, jitter=jitter)  # fmt: skip
    arrivals = [(0.0, 16000, 40), (0.0, 9000, 1), (0.3, 20000, 25), (2.0, 500, 3), (9.0, 12, 60)]
    checked = _check(sim, arrivals)
    assert checked == 2 * len(arrivals) - 1  # a one-token request's first token is its last


def test_with_nothing_to_do_nothing_can_be_told():
    sim = ReplicaSim(CostModel(Profile(), tp=8, pp=1, ep=1, gpus_per_node=8),
                     chunk_size=8192, max_running=8)  # fmt: skip
    assert sim.next_telling_time() == float("inf")
