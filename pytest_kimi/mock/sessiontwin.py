"""The offline twin of a session workload: conversations through the router onto replicas
that keep SGLang's prefix cache, in cluster time, no processes.

What the live run does, step by step (:mod:`pytest_kimi.workload.sessionsend`): the warm-up
requests one by one; then ``concurrency`` sessions at once; each later turn of a session
after a think time (drawn as the client draws it, from ``Random(f"{seed}:{session id}")``)
from the end of its answer, carrying the whole conversation so far with the answers the
server gave; a session's slot to the next session when its last turn ends. Each request goes
where the router's policy sends it (:mod:`pytest_kimi.mock.routermodel`) and is served by that
replica's scheduler with its radix cache (:mod:`pytest_kimi.mock.prefixreuse`), with the
token ids the live mock would see. So the twin predicts each policy's cache hits and what
they do to TTFT, which the live run must then show.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pytest_kimi.mock.reqstate import output_words
from pytest_kimi.mock.routermodel import CacheAware, RoundRobin
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.simrequest import SimRequest, TokenIds
from pytest_kimi.mock.tokenizer_files import token_ids
from pytest_kimi.workload.sessions import Message, Session, ThinkTime


@dataclass(frozen=True)
class SessionPlan:
    """What the client sends: ``warmup`` texts first, then the sessions."""

    sessions: Sequence[Session]
    warmup: Sequence[str]
    render: Callable[[list[Message]], str]  # a conversation as the /generate text
    output_len: int
    concurrency: int
    think: ThinkTime  # cluster seconds
    seed: int


@dataclass
class TwinTurn:
    """One measured request of the twin: its session and turn, and the model's truth."""

    session: str
    turn: int
    replica: int
    request: SimRequest


@dataclass
class _Run:
    plan: SessionPlan
    sims: list[ReplicaSim]
    router: RoundRobin | CacheAware
    turns: list[TwinTurn] = field(default_factory=list)
    answers: dict[str, list[str]] = field(default_factory=dict)
    where: dict[str, tuple[int, Session, int]] = field(default_factory=dict)  # rid ->
    pending: list[tuple[float, int, Session, int]] = field(default_factory=list)  # a heap
    order: itertools.count = field(default_factory=itertools.count)

    def send(self, at: float, rid: str, text: str) -> tuple[int, SimRequest]:
        ids = token_ids(text)
        replica = self.router.choose(text)
        sim = self.sims[replica]
        sim.advance(at)  # the replica reaches the arrival first, as the live engine does
        answer = output_words(rid, self.plan.output_len)
        req = sim.add(rid, len(ids), self.plan.output_len, at,
                      ids=TokenIds(ids, tuple(answer.ids)))  # fmt: skip
        return replica, req

    def send_turn(self, at: float, session: Session, k: int) -> None:
        rid = f"{session.id}/{k}"
        answers = self.answers.setdefault(session.id, [])
        text = self.plan.render(session.messages(k, answers))
        replica, req = self.send(at, rid, text)
        self.where[rid] = (replica, session, k)
        self.turns.append(TwinTurn(session.id, k, replica, req))

    def next_event(self) -> tuple[float, int] | None:
        """The earliest replica event (time, replica), if any."""
        times = [(t, i) for i, s in enumerate(self.sims) if (t := s.next_event_time()) is not None]
        return min(times) if times else None


def simulate_sessions(
    plan: SessionPlan, sims: list[ReplicaSim], router: RoundRobin | CacheAware
) -> list[TwinTurn]:
    """Every measured turn of ``plan`` on ``sims`` behind ``router``
    (:func:`~pytest_kimi.mock.routermodel.router_model`), in the order sent."""
    run = _Run(plan, sims, router)
    start = _warm_up(run)
    queue = list(plan.sessions)
    rngs = {s.id: random.Random(f"{plan.seed}:{s.id}") for s in queue}
    for _ in range(min(plan.concurrency, len(queue))):
        run.send_turn(start, queue.pop(0), 0)
    while True:
        event = run.next_event()
        if run.pending and (event is None or run.pending[0][0] < event[0]):
            at, _, session, k = heapq.heappop(run.pending)
            run.send_turn(at, session, k)
            continue
        if event is None:
            return run.turns
        at, i = event
        for done in run.sims[i].advance(at):
            if done.finished and done.rid in run.where:
                _finished(run, run.where.pop(done.rid), at, queue, rngs)


def _finished(run: _Run, where: tuple[int, Session, int], at: float, queue: list[Session],
              rngs: dict[str, random.Random]) -> None:  # fmt: skip
    """A turn ended at ``at``: the session's next turn after its think time, or the slot to
    the next session."""
    replica, session, k = where
    run.router.done(replica)
    run.answers[session.id].append(output_words(f"{session.id}/{k}", run.plan.output_len).text)
    if k + 1 < len(session.turns):
        pause = run.plan.think.draw(rngs[session.id])
        if pause <= 0:
            run.send_turn(at, session, k + 1)
        else:
            heapq.heappush(run.pending, (at + pause, next(run.order), session, k + 1))
    elif queue:
        run.send_turn(at, queue.pop(0), 0)


def _warm_up(run: _Run) -> float:
    """The warm-up requests one after another; when the measured run starts."""
    at = 0.0
    for i, text in enumerate(run.plan.warmup):
        replica, req = run.send(at, f"warmup-{i}", text)
        while req.finished_at is None:
            nxt = run.sims[replica].next_event_time()
            assert nxt is not None
            run.sims[replica].advance(nxt)
        run.router.done(replica)
        at = req.finished_at
    return at


def hit_rate(turns: Sequence[TwinTurn]) -> float:
    """Cached prompt tokens over prompt tokens, as the run's summary counts them."""
    prompt = sum(t.request.prompt_tokens for t in turns)
    return sum(t.request.cached for t in turns) / prompt if prompt else 0.0


def mean_ttft(turns: Sequence[TwinTurn]) -> float:
    """Cluster seconds from arrival to first token, over the measured turns."""
    firsts = [t.request.first_token_at - t.request.arrival for t in turns
              if t.request.first_token_at is not None]  # fmt: skip
    return sum(firsts) / len(firsts)
