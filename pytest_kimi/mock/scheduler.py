"""A continuous-batching scheduler like SGLang's, run as a discrete-event simulation.

It knows nothing of wall time or HTTP: requests arrive at cluster times, batches are formed
whenever pipeline stage 0 is free, and :meth:`ReplicaSim.advance` returns the tokens that
finished at each event. The same object drives the live mock server (through
:mod:`pytest_kimi.mock.engine`) and offline simulations in tests, so both agree exactly.

Scheduling rules (SGLang's defaults, radix cache off):
* a FIFO waiting queue; at most ``max_running_requests`` requests admitted;
* prefill in chunks of at most ``chunk_size`` tokens per batch, one partially-prefilled request
  at a time; a request's last prefill chunk yields its first token;
* without ``mixed_chunk`` a batch is either prefill or decode, prefill first (SGLang's default);
  with it (``--enable-mixed-chunk``) running decodes ride along with the prefill chunk;
* with PP, up to ``pp`` micro-batches are in flight; a request sits in at most one of them.

For prefill/decode disaggregation (:mod:`pytest_kimi.mock.disagg`) the same scheduler serves
either side: a prefill server's requests ask for one token (SGLang sets ``max_new_tokens`` to
1 there) and :attr:`ReplicaSim.on_chunk` hears of each prefilled chunk, whose KV is then sent;
a decode server takes requests whose KV has arrived (:meth:`ReplicaSim.add_prebuilt`) and,
as SGLang's "prebuilt" step does, gives each its first token (the prefill's) at the first
step boundary after it landed, with no forward pass, before decoding it with the rest.

With speculative decoding (:mod:`pytest_kimi.mock.speculative`) a decode step is the draft
model's ``num_steps`` forwards plus the target's verify, and gives each request 1 to
``num_draft_tokens`` tokens at once; prefill chunks also run the draft over their tokens.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_kimi.mock.perfmodel import CostModel, Prefill
from pytest_kimi.mock.speculative import A_MIN, Drafts, SpecCounters, Speculation


@dataclass
class SimRequest:
    """Model-side state and ground truth of one request (cluster seconds)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    arrival: float
    prefilled: int = 0
    generated: int = 0
    in_flight: bool = False
    admitted_at: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per token
    finished_at: float | None = None
    drafts: Drafts | None = None  # speculative decoding: this request's acceptance and counts

    @property
    def first_token_at(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def ground_truth(self) -> dict:
        return {
            "rid": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "arrival": self.arrival,
            "admitted": self.admitted_at,
            "first_token": self.first_token_at,
            "token_times": list(self.token_times),
            "finished": self.finished_at,
        }


@dataclass(frozen=True)
class TokenEvent:
    """``count`` new tokens for ``rid`` at cluster time ``time``; ``aborted``: no tokens, the
    request was aborted (``/abort_request``) and ends here."""

    rid: str
    time: float
    count: int
    generated: int
    finished: bool
    aborted: bool = False


@dataclass
class _Batch:
    prefills: list[tuple[SimRequest, int]]
    decodes: list[SimRequest]
    done_at: float = 0.0
    seq: int = 0
    started: float = 0.0

    def __lt__(self, other: _Batch) -> bool:
        return (self.done_at, self.seq) < (other.done_at, other.seq)


class ReplicaSim:
    """One replica's scheduler over a cost model."""

    def __init__(
        self,
        cost: CostModel,
        *,
        chunk_size: int,
        max_running: int,
        mixed_chunk: bool = False,
        seed: int = 0,
        jitter: float = 0.0,
        spec: Speculation | None = None,
        decode_log_interval: int = 40,
    ) -> None:
        self.cost, self.chunk_size, self.max_running = cost, chunk_size, max_running
        self.mixed_chunk, self.jitter = mixed_chunk and spec is None, jitter
        self.spec, self.decode_log_interval = spec, decode_log_interval
        self.spec_counters = SpecCounters()
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []  # admitted: prefilling or decoding
        self.requests: dict[str, SimRequest] = {}
        self.stage_free = [0.0] * cost.pp
        self.in_flight: list[_Batch] = []
        self.steps = 0
        self._fastest: float | None = None
        self.busy_s = 0.0  # cluster seconds a stage spent on batches (GPU utilisation)
        self.prebuilt: list[SimRequest] = []  # decode side: KV landed (or landing), in order
        # prefill side: (request, tokens, started, done: cluster times) per prefilled chunk
        self.on_chunk: Callable[[SimRequest, int, float, float], None] | None = None

    # -- inputs --------------------------------------------------------------------------
    def add(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, at: float,
        drafts: Drafts | None = None,
    ) -> SimRequest:  # fmt: skip
        """A request arrives at cluster time ``at`` (not before :attr:`now`). ``drafts``: its
        acceptance under speculative decoding (from its prompt)."""
        req = SimRequest(rid, max(1, prompt_tokens), max(1, max_new_tokens), max(at, self.now))
        req.drafts = self._drafts(rid, drafts)
        self.requests[rid] = req
        self.waiting.append(req)
        return req

    def add_prebuilt(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, at: float,
        drafts: Drafts | None = None,
    ) -> SimRequest:  # fmt: skip
        """Decode side: a request whose KV cache lands at cluster time ``at`` (not before
        :attr:`now`), its prompt already prefilled elsewhere. Admitted at the first step
        boundary from then on (FIFO, up to ``max_running``), where its first token comes out."""
        req = SimRequest(rid, max(1, prompt_tokens), max(1, max_new_tokens), max(at, self.now))
        req.prefilled = req.prompt_tokens
        req.drafts = self._drafts(rid, drafts)
        self.requests[rid] = req
        self.prebuilt.append(req)
        self.prebuilt.sort(key=lambda r: r.arrival)  # stable: equal landings keep their order
        return req

    def _drafts(self, rid: str, drafts: Drafts | None) -> Drafts | None:
        """A request's drafting when this server speculates: as given, else the lowest
        acceptance (a prompt the caller did not show), seeded by the request id."""
        if self.spec is None:
            return None
        return drafts or Drafts(A_MIN, random.Random(f"{self.seed}:{rid}").getrandbits(32))

    def abort(self, rid: str) -> None:
        """Drop a request whose client went away (SGLang aborts it too)."""
        req = self.requests.get(rid)
        if req is None or req.finished_at is not None:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.prebuilt:
            self.prebuilt.remove(req)
        if req in self.running and not req.in_flight:
            self.running.remove(req)
        req.finished_at = self.now
        req.max_new_tokens = req.generated

    # -- event loop ------------------------------------------------------------------------
    def next_event_time(self) -> float | None:
        """Cluster time of the next batch completion or batch start, if any."""
        times = [b.done_at for b in self.in_flight]
        if self._has_work():
            times.append(max(self.now, self.stage_free[0]))
        admit = self._next_admission()
        if admit is not None:
            times.append(admit)
        return min(times) if times else None

    def _next_admission(self) -> float | None:
        """When the next landed request can be admitted (its first token comes out then)."""
        if not self.prebuilt or len(self.running) >= self.max_running:
            return None
        return max(self.now, self.prebuilt[0].arrival, self.stage_free[0])

    def next_telling_time(self) -> float:
        """The earliest cluster time a request's first or last token can come out (inf: none
        can): an in-flight batch that completes a prompt or a request, or any batch not
        launched yet, which launches at the next event at the soonest and takes at least the
        fastest any batch can go through the pipeline.

        Tokens in between may be emitted late without changing any per-request figure; these
        may not (a live engine on a shared clock waits for the clock here)."""
        times = [b.done_at for b in self.in_flight if self._telling(b)]
        nxt = self.next_event_time()
        if nxt is not None:
            times.append(nxt + self._fastest_batch())
        admit = self._next_admission()
        if admit is not None:  # a first token, with no batch to wait for
            times.append(admit)
        return min(times, default=math.inf)

    def _telling(self, batch: _Batch) -> bool:
        if any(r.prefilled + n >= r.prompt_tokens for r, n in batch.prefills):
            return True
        most = 1 + (self.spec.max_drafts if self.spec is not None else 0)  # tokens per step
        return any(r.generated + most >= r.max_new_tokens for r in batch.decodes)

    def _fastest_batch(self) -> float:
        """A lower bound of any batch's time from launch to completion: one token through
        every stage and hop, at the lowest noise factor (:meth:`_noise`)."""
        if self._fastest is None:
            stage = self.cost.stage_time([], [0]) * (0.5 if self.jitter > 0 else 1.0)
            hops = sum(self.cost.hop_time(1, s) for s in range(self.cost.pp - 1))
            self._fastest = self.cost.pp * stage + hops
        return self._fastest

    def advance(self, until: float) -> list[TokenEvent]:
        """Process every event up to cluster time ``until``; return emitted tokens."""
        events: list[TokenEvent] = []
        while True:
            nxt = self.next_event_time()
            if nxt is None or nxt > until:
                break
            self.now = max(self.now, nxt)
            while self.in_flight and self.in_flight[0].done_at <= self.now:
                events.extend(self._complete(heapq.heappop(self.in_flight)))
            if self.stage_free[0] <= self.now:
                events.extend(self._admit_prebuilt())
            if self.stage_free[0] <= self.now and len(self.in_flight) < self.cost.pp:
                self._launch()
        self.now = max(self.now, until)
        return events

    # -- internals ---------------------------------------------------------------------------
    def _has_work(self) -> bool:
        if len(self.in_flight) >= self.cost.pp:
            return False
        if any(self._can_decode(r) or self._can_prefill(r) for r in self.running):
            return True
        return bool(self.waiting) and len(self.running) < self.max_running

    def _admit_prebuilt(self) -> list[TokenEvent]:
        """Landed requests join the running batch, each with its first token, now."""
        events = []
        while (
            self.prebuilt
            and self.prebuilt[0].arrival <= self.now
            and len(self.running) < self.max_running
        ):
            req = self.prebuilt.pop(0)
            req.admitted_at = self.now
            self.running.append(req)
            events.append(self._emit(req, self.now))
            self._maybe_drop(req)
        return events

    @staticmethod
    def _can_decode(req: SimRequest) -> bool:
        return not req.in_flight and req.generated > 0 and req.finished_at is None

    @staticmethod
    def _can_prefill(req: SimRequest) -> bool:
        return not req.in_flight and req.prefilled < req.prompt_tokens and req.finished_at is None

    def _launch(self) -> None:
        prefills = self._take_prefill()
        decodes: list[SimRequest] = []
        if not prefills or self.mixed_chunk:
            decodes = [r for r in self.running if self._can_decode(r)]
        if not prefills and not decodes:
            return
        batch = _Batch(prefills, decodes, seq=self.steps, started=self.now)
        self.steps += 1
        for req, _ in prefills:
            req.in_flight = True
        for req in decodes:
            req.in_flight = True
        chunks = [Prefill(n, req.prefilled) for req, n in prefills]
        contexts = [r.prompt_tokens + r.generated for r in decodes]
        tokens = sum(n for _, n in prefills) + len(decodes)
        stage = self._stage_time(chunks, contexts) * self._noise()
        self.busy_s += stage
        t = self.now
        for s in range(self.cost.pp):
            start = max(t, self.stage_free[s])
            self.stage_free[s] = start + stage
            t = start + stage
            if s + 1 < self.cost.pp:
                t += self.cost.hop_time(tokens, s)
        batch.done_at = t
        heapq.heappush(self.in_flight, batch)

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

    def _take_prefill(self) -> list[tuple[SimRequest, int]]:
        budget = self.chunk_size
        out: list[tuple[SimRequest, int]] = []
        for req in self.running:  # a partially prefilled request continues first
            if self._can_prefill(req) and budget > 0:
                n = min(budget, req.prompt_tokens - req.prefilled)
                out.append((req, n))
                budget -= n
        chunked = any(r.prefilled + n < r.prompt_tokens for r, n in out)
        while self.waiting and budget > 0 and not chunked:
            if len(self.running) >= self.max_running:
                break
            req = self.waiting.pop(0)
            req.admitted_at = self.now
            self.running.append(req)
            n = min(budget, req.prompt_tokens)
            out.append((req, n))
            budget -= n
            chunked = n < req.prompt_tokens
        return out

    def _noise(self) -> float:
        if self.jitter <= 0:
            return 1.0
        return max(0.5, self.rng.gauss(1.0, self.jitter))

    def _complete(self, batch: _Batch) -> list[TokenEvent]:
        events = []
        for req, n in batch.prefills:
            req.in_flight = False
            req.prefilled += n
            if self.on_chunk is not None and req.finished_at is None:
                self.on_chunk(req, n, batch.started, batch.done_at)
            if req.prefilled == req.prompt_tokens and req.finished_at is None:
                events.append(self._emit(req, batch.done_at))
        accepted = 0
        for req in batch.decodes:
            req.in_flight = False
            if req.finished_at is None:
                n = 1
                if self.spec is not None and req.drafts is not None:
                    drafts = req.drafts.step(self.spec.max_drafts)
                    # the gauges count what the request kept (SGLang recomputes a finishing
                    # request's accept length); its meta_info counts every accepted draft
                    accepted += min(drafts, req.max_new_tokens - req.generated - 1)
                    n += drafts
                events.append(self._emit(req, batch.done_at, n))
        if self.spec is not None and batch.decodes:
            counters, spec = self.spec_counters, self.spec
            counters.verified(accepted, len(batch.decodes), spec.num_draft_tokens,
                              self.decode_log_interval)  # fmt: skip
        elif batch.decodes:
            self.spec_counters.decoded(self.decode_log_interval)
        for req, _ in batch.prefills:
            self._maybe_drop(req)
        for req in batch.decodes:
            self._maybe_drop(req)
        return events

    def _emit(self, req: SimRequest, at: float, n: int = 1) -> TokenEvent:
        """``n`` tokens at once (speculative decoding's accepted drafts plus the target's
        own), never past ``max_new_tokens`` (SGLang stops a request there)."""
        n = min(n, req.max_new_tokens - req.generated)
        req.generated += n
        req.token_times.extend([at] * n)
        finished = req.generated >= req.max_new_tokens
        if finished:
            req.finished_at = at
        return TokenEvent(req.rid, at, n, req.generated, finished)

    def _maybe_drop(self, req: SimRequest) -> None:
        if req.finished_at is not None and req in self.running:
            self.running.remove(req)
