"""A replica's pipeline: its stages, the batches in flight through them, and what each takes.

The scheduler (:class:`pytest_kimi.mock.scheduler.ReplicaSim`) decides what goes into a
batch; here the batch is timed (one stage's time from the cost model, with speculative
decoding the draft's forwards and the target's verify, times the jitter's noise), passed
through the ``pp`` stages one after another with the hops between them (a stage takes the
next micro-batch as soon as it is free), and, once out of the last, moves its requests on:
prefilled chunks, and tokens.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pytest_kimi.mock.perfmodel import CostModel, Prefill
from pytest_kimi.mock.simrequest import SimRequest, TokenEvent
from pytest_kimi.mock.speculative import SpecCounters, Speculation

# a prefilled chunk: (request, tokens, started, done: cluster times)
OnChunk = Callable[[SimRequest, int, float, float], None]


@dataclass
class Batch:
    """One step of the model: prefill chunks (request, tokens) and decodes, launched at
    ``started``, out of the last stage at ``done_at`` (cluster times)."""

    prefills: list[tuple[SimRequest, int]]
    decodes: list[SimRequest]
    done_at: float = 0.0
    seq: int = 0
    started: float = 0.0

    def __lt__(self, other: Batch) -> bool:
        return (self.done_at, self.seq) < (other.done_at, other.seq)

    def telling(self, spec: Speculation | None) -> bool:
        """Whether its completion can give a request its first or last token."""
        if any(r.prefilled + n >= r.prompt_tokens for r, n in self.prefills):
            return True
        most = 1 + (spec.max_drafts if spec is not None else 0)  # tokens per step
        return any(r.generated + most >= r.max_new_tokens for r in self.decodes)

    def complete(
        self, on_chunk: OnChunk | None, spec: Speculation | None, counters: SpecCounters,
        log_every: int,
    ) -> list[TokenEvent]:  # fmt: skip
        """Its requests move on at its end: each prefill chunk counts (``on_chunk`` hears of
        it) and a prompt's last gives its first token; each decode gives its tokens (1 plus the
        accepted drafts under speculative decoding), and ``counters`` count the step (the
        decode log every ``log_every`` steps). Returns the tokens."""
        events = []
        for req, n in self.prefills:
            req.in_flight = False
            req.prefilled += n
            if on_chunk is not None and req.finished_at is None:
                on_chunk(req, n, self.started, self.done_at)
            if req.prefilled == req.prompt_tokens and req.finished_at is None:
                events.append(req.emit(self.done_at))
        accepted = 0
        for req in self.decodes:
            req.in_flight = False
            if req.finished_at is None:
                n = 1
                if spec is not None and req.drafts is not None:
                    drafts = req.drafts.step(spec.max_drafts)
                    # the gauges count what the request kept (SGLang recomputes a finishing
                    # request's accept length); its meta_info counts every accepted draft
                    accepted += min(drafts, req.max_new_tokens - req.generated - 1)
                    n += drafts
                events.append(req.emit(self.done_at, n))
        if spec is not None and self.decodes:
            counters.verified(accepted, len(self.decodes), spec.num_draft_tokens, log_every)
        elif self.decodes:
            counters.decoded(log_every)
        return events


class Pipeline:
    """The stages of one replica over a cost model, and the batches in flight through them
    (a heap by completion time)."""

    def __init__(
        self, cost: CostModel, *, seed: int, jitter: float, spec: Speculation | None
    ) -> None:
        self.cost, self.jitter, self.spec = cost, jitter, spec
        self.rng = random.Random(seed)
        self.stage_free = [0.0] * cost.pp
        self.in_flight: list[Batch] = []
        self._fastest: float | None = None

    @property
    def free_at(self) -> float:
        """When the first stage can take the next batch (cluster time)."""
        return self.stage_free[0]

    @property
    def full(self) -> bool:
        """A batch in flight on every stage: no more can launch."""
        return len(self.in_flight) >= self.cost.pp

    def done_by(self, now: float) -> Iterator[Batch]:
        """The batches out of the last stage by ``now``, in order (each leaves the pipeline as
        it is taken)."""
        while self.in_flight and self.in_flight[0].done_at <= now:
            yield heapq.heappop(self.in_flight)

    def launch(self, batch: Batch, now: float) -> float:
        """Start ``batch`` at cluster time ``now``; returns its time on one stage."""
        prefills, decodes = batch.prefills, batch.decodes
        for req, _ in prefills:
            req.in_flight = True
        for req in decodes:
            req.in_flight = True
        chunks = [Prefill(n, req.prefilled) for req, n in prefills]
        contexts = [r.prompt_tokens + r.generated for r in decodes]
        tokens = sum(n for _, n in prefills) + len(decodes)
        stage = self._stage_time(chunks, contexts) * self._noise()
        t = now
        for s in range(self.cost.pp):
            start = max(t, self.stage_free[s])
            self.stage_free[s] = start + stage
            t = start + stage
            if s + 1 < self.cost.pp:
                t += self.cost.hop_time(tokens, s)
        batch.done_at = t
        heapq.heappush(self.in_flight, batch)
        return stage

    def fastest_batch(self) -> float:
        """A lower bound of any batch's time from launch to completion: one token through
        every stage and hop, at the lowest noise factor (:meth:`_noise`)."""
        if self._fastest is None:
            stage = self.cost.stage_time([], [0]) * (0.5 if self.jitter > 0 else 1.0)
            hops = sum(self.cost.hop_time(1, s) for s in range(self.cost.pp - 1))
            self._fastest = self.cost.pp * stage + hops
        return self._fastest

    def _stage_time(self, chunks: list[Prefill], contexts: list[int]) -> float:
        """A batch's time on one stage; with speculative decoding, decodes are verified
        after ``num_steps`` draft forwards and prefill chunks run the draft too."""
        if self.spec is None:
            return self.cost.stage_time(chunks, contexts)
        drafted = self.spec.num_steps * self.cost.draft_time(len(contexts)) if contexts else 0.0
        verify = self.cost.verify_time(contexts, self.spec.num_draft_tokens) if contexts else 0.0
        prefill = self.cost.stage_time(chunks, []) if chunks else 0.0
        extend = self.cost.draft_time(sum(c.tokens for c in chunks))
        return prefill + extend + verify + drafted

    def _noise(self) -> float:
        if self.jitter <= 0:
            return 1.0
        return max(0.5, self.rng.gauss(1.0, self.jitter))
