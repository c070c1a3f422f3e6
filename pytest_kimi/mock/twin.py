"""Offline run of the mock's model: a DP deployment and a closed-loop client in virtual time.

Used to calibrate the profile against the seed report and to check, without starting a
process, that a layout's parallelism moves TTFT and TPOT the way the real cluster did.
The live mock runs the very same :class:`ReplicaSim` on a shared clock that keeps client,
router and HTTP time out, so a local run reports these figures (tests/integration/
test_twin_live.py holds every seed cell within 1%).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.scheduler import ReplicaSim, SimRequest


@dataclass(frozen=True)
class TwinRun:
    """Ground truth of every request of one simulated run (cluster seconds)."""

    requests: tuple[SimRequest, ...]

    @property
    def duration(self) -> float:
        return max(r.finished_at or 0.0 for r in self.requests) - min(
            r.arrival for r in self.requests
        )


def simulate(
    profile: Profile,
    *,
    tp: int,
    pp: int,
    ep: int,
    gpus_per_node: int,
    replicas: int,
    num_requests: int,
    input_lens: Sequence[int],
    output_len: int,
    concurrency: int,
    chunk_size: int = 8192,
    seed: int = 0,
    reaction_s: float = 0.0,
) -> TwinRun:
    """Round-robin over ``replicas``, ``concurrency`` clients each sending back to back.

    Request ``i`` has ``input_lens[i % len(input_lens)]`` prompt tokens. ``reaction_s``: cluster
    seconds from a request's last token to the arrival of the request its freed slot sends
    (client, router and HTTP together); 0 is an instant client, which is what a local live run
    on the shared clock is; without it the gap is the client's wall-clock reaction times the
    time scale (docs/mock.md, "One clock")."""
    sims = [
        ReplicaSim(
            CostModel(profile, tp=tp, pp=pp, ep=ep, gpus_per_node=gpus_per_node),
            chunk_size=chunk_size,
            max_running=profile.max_running_requests,
            seed=seed + i,
            jitter=profile.jitter,
        )
        for i in range(replicas)
    ]
    done: list[SimRequest] = []
    sent = 0

    def send(at: float) -> None:
        nonlocal sent
        sim = sims[sent % replicas]
        backlog.extend((sim, e) for e in sim.advance(at))  # bring it to `at` first
        sim.add(f"r{sent}", input_lens[sent % len(input_lens)], output_len, at)
        sent += 1

    backlog: list = []
    pending: list[float] = []  # a heap: arrivals of follow-ups still on their way
    for _ in range(min(concurrency, num_requests)):
        send(0.0)
    while len(done) < num_requests:
        if not backlog:
            times = [(t, i) for i, s in enumerate(sims) if (t := s.next_event_time()) is not None]
            if pending and (not times or pending[0] <= min(times)[0]):
                send(heapq.heappop(pending))  # the next thing to happen is an arrival
                continue
            if not times:
                raise RuntimeError("simulation stalled with requests outstanding")
            t, i = min(times)
            backlog.extend((sims[i], e) for e in sims[i].advance(t))
            continue
        sim, event = backlog.pop(0)
        if event.finished:
            done.append(sim.requests[event.rid])
            if sent + len(pending) < num_requests:
                if reaction_s > 0:
                    heapq.heappush(pending, event.time + reaction_s)
                else:
                    send(event.time)
    return TwinRun(tuple(done))
