"""Offline run of the mock's model: a DP deployment and a closed-loop client in virtual time.

:func:`simulate` plays replicas that each serve a request whole; :func:`simulate_pd` a
disaggregated deployment, prefill replicas handing each prompt's KV cache to decode replicas
as the live mock does (:mod:`pytest_kimi.mock.disagg`), on the same links
(:mod:`pytest_kimi.mock.kvlink`).

Used to calibrate the profile against the seed report and to check, without starting a
process, that a layout's parallelism moves TTFT and TPOT the way the real cluster did.
The live mock runs the very same :class:`ReplicaSim` on a shared clock that keeps client,
router and HTTP time out, so a local run reports these figures (tests/integration/
test_twin_live.py holds every seed cell within 1%).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_kimi.mock.kvlink import Link, kv_bytes, side_bandwidth
from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.scheduler import ReplicaSim, SimRequest, TokenEvent
from pytest_kimi.mock.speculative import Drafts, Speculation, acceptance, prompt_seed


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
    spec: Speculation | None = None,
    prompts: Sequence[str] = (),
    max_running: int | None = None,
) -> TwinRun:
    """Round-robin over ``replicas``, ``concurrency`` clients each sending back to back.

    Request ``i`` has ``input_lens[i % len(input_lens)]`` prompt tokens; under speculative
    decoding (``spec``) its drafts are accepted as the live mock accepts ``prompts[i %
    len(prompts)]``'s (seeded by the prompt, as on every live replica).
    ``reaction_s``: cluster seconds from a request's last token to the arrival of the request
    its freed slot sends (client, router and HTTP together); 0 is an instant client, which is
    what a local live run on the shared clock is; without it the gap is the client's
    wall-clock reaction times the time scale (docs/mock.md, "One clock")."""
    sims = [
        ReplicaSim(
            CostModel(profile, tp=tp, pp=pp, ep=ep, gpus_per_node=gpus_per_node),
            chunk_size=chunk_size,
            max_running=max_running or profile.max_running_requests,  # as the live server's
            seed=seed + i,
            jitter=profile.jitter,
            spec=spec,
        )
        for i in range(replicas)
    ]
    done: list[SimRequest] = []
    sent = 0

    def send(at: float) -> None:
        nonlocal sent
        sim = sims[sent % replicas]
        backlog.extend((sim, e) for e in sim.advance(at))  # bring it to `at` first
        drafts = None
        if spec is not None and prompts:
            text = prompts[sent % len(prompts)]
            drafts = Drafts(acceptance(text), prompt_seed(text))
        sim.add(f"r{sent}", input_lens[sent % len(input_lens)], output_len, at, drafts)
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


@dataclass(frozen=True)
class Side:
    """One side of a disaggregated deployment: its replicas' sizes and how many there are."""

    tp: int
    pp: int
    ep: int
    nodes: int  # per replica
    replicas: int = 1
    gpus_per_node: int = 8


def simulate_pd(
    profile: Profile,
    *,
    prefill: Side,
    decode: Side,
    num_requests: int,
    input_lens: Sequence[int],
    output_len: int,
    concurrency: int,
    chunk_size: int = 8192,
    seed: int = 0,
) -> TwinRun:
    """A closed loop at ``concurrency`` through a router in PD mode (round robin on each side).

    Per request, as the live servers do: the decode replica preallocates (or queues until a
    slot frees: ``max_running_requests``), the prefill replica then prefills it making one
    token and sends each chunk's KV as it is done over its egress, the decode replica's ingress
    lands it, and the decode replica gives the first token at its next step boundary and
    decodes the rest. Returns the decode side's requests (what the client sees), with
    ``arrival`` the router's send."""

    def sim(side: Side, i: int) -> ReplicaSim:
        cost = CostModel(profile, tp=side.tp, pp=side.pp, ep=side.ep,
                         gpus_per_node=side.gpus_per_node)  # fmt: skip
        return ReplicaSim(cost, chunk_size=chunk_size, max_running=profile.max_running_requests,
                          seed=seed + i, jitter=profile.jitter)  # fmt: skip

    prefills = [sim(prefill, i) for i in range(prefill.replicas)]
    decodes = [sim(decode, prefill.replicas + i) for i in range(decode.replicas)]
    everyone = [*prefills, *decodes]
    egress = [Link(side_bandwidth(profile, prefill.nodes)) for _ in prefills]
    ingress = [Link(side_bandwidth(profile, decode.nodes)) for _ in decodes]
    spans: dict[str, list] = {}
    pair: dict[str, tuple[int, int]] = {}
    arrived: dict[str, float] = {}
    prompt_of: dict[str, int] = {}
    occupied = [0] * len(decodes)
    waiting: list[list[str]] = [[] for _ in decodes]  # decode prealloc queues
    backlog: list[tuple[int, TokenEvent]] = []  # (replica, event) not yet looked at
    done: list[SimRequest] = []
    sent = 0

    def start_prefill(rid: str, at: float) -> None:
        p, d = pair[rid]
        occupied[d] += 1
        backlog.extend((p, e) for e in prefills[p].advance(at))  # bring it to `at` first
        prefills[p].add(rid, prompt_of[rid], 1, at)

    def send(at: float) -> None:
        nonlocal sent
        rid = f"r{sent}"
        pair[rid] = (sent % len(prefills), sent % len(decodes))
        prompt_of[rid], arrived[rid] = input_lens[sent % len(input_lens)], at
        sent += 1
        d = pair[rid][1]
        if occupied[d] < profile.max_running_requests and not waiting[d]:
            start_prefill(rid, at)
        else:
            waiting[d].append(rid)

    def chunk_of(p: int) -> Callable[[SimRequest, int, float, float], None]:
        def heard(req: SimRequest, tokens: int, started: float, done_at: float) -> None:
            spans.setdefault(req.rid, []).append(
                egress[p].send(done_at, kv_bytes(profile, tokens, decode.tp))
            )
            if req.prefilled == req.prompt_tokens:  # the last chunk: the KV lands, then
                d = pair[req.rid][1]
                landed = max(ingress[d].receive(s).end for s in spans.pop(req.rid))
                decodes[d].add_prebuilt(req.rid, req.prompt_tokens, output_len, landed)

        return heard

    for p, s in enumerate(prefills):
        s.on_chunk = chunk_of(p)
    for _ in range(min(concurrency, num_requests)):
        send(0.0)
    while len(done) < num_requests:
        if not backlog:
            times = [(t, i) for i, r in enumerate(everyone)
                     if (t := r.next_event_time()) is not None]  # fmt: skip
            if not times:
                raise RuntimeError("simulation stalled with requests outstanding")
            t, i = min(times)
            backlog.extend((i, e) for e in everyone[i].advance(t))
            continue
        i, event = backlog.pop(0)
        if i < len(prefills) or not event.finished:
            continue  # a prefill's one token goes to the router; its KV is handled above
        d = i - len(prefills)
        req = decodes[d].requests[event.rid]
        req.arrival = arrived[event.rid]  # the client's view: from the router's send
        done.append(req)
        occupied[d] -= 1
        if waiting[d]:
            start_prefill(waiting[d].pop(0), event.time)
        if sent < num_requests:
            send(event.time)
    return TwinRun(tuple(done))
