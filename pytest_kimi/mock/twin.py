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
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.simrequest import SimRequest, TokenEvent
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
    prefills = [_pd_replica(profile, prefill, i, chunk_size, seed) for i in range(prefill.replicas)]
    decodes = [_pd_replica(profile, decode, prefill.replicas + i, chunk_size, seed)
               for i in range(decode.replicas)]  # fmt: skip
    run = _PdRun(profile, prefills, decodes, prefill_nodes=prefill.nodes, decode=decode,
                 input_lens=input_lens, output_len=output_len)  # fmt: skip
    for _ in range(min(concurrency, num_requests)):
        run.send(0.0)
    while len(run.done) < num_requests:
        if not run.backlog:
            run.advance_first()
            continue
        i, event = run.backlog.pop(0)
        if i < len(prefills) or not event.finished:
            continue  # a prefill's one token goes to the router; its KV is handled above
        run.finished(i - len(prefills), event)
        if run.sent < num_requests:
            run.send(event.time)
    return TwinRun(tuple(run.done))


def _pd_replica(profile: Profile, side: Side, i: int, chunk_size: int, seed: int) -> ReplicaSim:
    """Replica ``i`` of a disaggregated deployment (both sides count on from one seed)."""
    cost = CostModel(profile, tp=side.tp, pp=side.pp, ep=side.ep,
                     gpus_per_node=side.gpus_per_node)  # fmt: skip
    return ReplicaSim(cost, chunk_size=chunk_size, max_running=profile.max_running_requests,
                      seed=seed + i, jitter=profile.jitter)  # fmt: skip


class _PdRun:
    """One :func:`simulate_pd` run's state: where each request went, the decode replicas' slots
    and prealloc queues, the KV on its way, and the events not looked at yet."""

    def __init__(
        self, profile: Profile, prefills: list[ReplicaSim], decodes: list[ReplicaSim], *,
        prefill_nodes: int, decode: Side, input_lens: Sequence[int], output_len: int,
    ) -> None:  # fmt: skip
        self.profile, self.prefills, self.decodes = profile, prefills, decodes
        self.decode_tp, self.input_lens, self.output_len = decode.tp, input_lens, output_len
        self.everyone = [*prefills, *decodes]
        self.egress = [Link(side_bandwidth(profile, prefill_nodes)) for _ in prefills]
        self.ingress = [Link(side_bandwidth(profile, decode.nodes)) for _ in decodes]
        self.spans: dict[str, list] = {}
        self.pair: dict[str, tuple[int, int]] = {}
        self.arrived: dict[str, float] = {}
        self.prompt_of: dict[str, int] = {}
        self.occupied = [0] * len(decodes)
        self.waiting: list[list[str]] = [[] for _ in decodes]  # decode prealloc queues
        self.backlog: list[tuple[int, TokenEvent]] = []  # (replica, event) not yet looked at
        self.done: list[SimRequest] = []
        self.sent = 0
        for p, s in enumerate(prefills):
            s.on_chunk = self._chunk_of(p)

    def start_prefill(self, rid: str, at: float) -> None:
        p, d = self.pair[rid]
        self.occupied[d] += 1
        self.backlog.extend((p, e) for e in self.prefills[p].advance(at))  # bring it to `at` first
        self.prefills[p].add(rid, self.prompt_of[rid], 1, at)

    def send(self, at: float) -> None:
        """The router sends the next request: its decode replica has a slot, or queues it."""
        rid = f"r{self.sent}"
        self.pair[rid] = (self.sent % len(self.prefills), self.sent % len(self.decodes))
        self.prompt_of[rid] = self.input_lens[self.sent % len(self.input_lens)]
        self.arrived[rid] = at
        self.sent += 1
        d = self.pair[rid][1]
        if self.occupied[d] < self.profile.max_running_requests and not self.waiting[d]:
            self.start_prefill(rid, at)
        else:
            self.waiting[d].append(rid)

    def _chunk_of(self, p: int) -> Callable[[SimRequest, int, float, float], None]:
        def heard(req: SimRequest, tokens: int, started: float, done_at: float) -> None:
            self.spans.setdefault(req.rid, []).append(
                self.egress[p].send(done_at, kv_bytes(self.profile, tokens, self.decode_tp))
            )
            if req.prefilled == req.prompt_tokens:  # the last chunk: the KV lands, then
                d = self.pair[req.rid][1]
                landed = max(self.ingress[d].receive(s).end for s in self.spans.pop(req.rid))
                self.decodes[d].add_prebuilt(req.rid, req.prompt_tokens, self.output_len, landed)

        return heard

    def advance_first(self) -> None:
        """Bring the replica whose next event comes first to it; its events to the backlog."""
        times = [(t, i) for i, r in enumerate(self.everyone)
                 if (t := r.next_event_time()) is not None]  # fmt: skip
        if not times:
            raise RuntimeError("simulation stalled with requests outstanding")
        t, i = min(times)
        self.backlog.extend((i, e) for e in self.everyone[i].advance(t))

    def finished(self, d: int, event: TokenEvent) -> None:
        """Decode replica ``d`` finished a request: the client has it, and its slot frees."""
        req = self.decodes[d].requests[event.rid]
        req.arrival = self.arrived[event.rid]  # the client's view: from the router's send
        self.done.append(req)
        self.occupied[d] -= 1
        if self.waiting[d]:
            self.start_prefill(self.waiting[d].pop(0), event.time)
