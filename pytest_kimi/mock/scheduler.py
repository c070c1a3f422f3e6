"""A continuous-batching scheduler like SGLang's, run as a discrete-event simulation.

It knows nothing of wall time or HTTP: requests arrive at cluster times, batches are formed
whenever pipeline stage 0 is free, and :meth:`ReplicaSim.advance` returns the tokens that
finished at each event. The same object drives the live mock server (through
:mod:`pytest_kimi.mock.engine`) and offline simulations in tests, so both agree exactly.

Scheduling rules (SGLang's defaults):
* a FIFO waiting queue; at most ``max_running_requests`` requests admitted;
* with the radix prefix cache (:mod:`pytest_kimi.mock.prefixreuse`; off under
  ``--disable-radix-cache``) a request admitted starts its prefill after its longest cached
  prefix, and its chunks and its end put its tokens in the tree;
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

Here are the queues and the choice of what each batch carries; what a batch takes and its way
through the stages are :mod:`pytest_kimi.mock.pipeline`'s, a request's state
:mod:`pytest_kimi.mock.simrequest`'s.
"""

from __future__ import annotations

import math
import random

from pytest_kimi.mock.perfmodel import CostModel
from pytest_kimi.mock.pipeline import Batch, OnChunk, Pipeline
from pytest_kimi.mock.prefixreuse import PrefixReuse
from pytest_kimi.mock.simrequest import NO_IDS, SimRequest, TokenEvent, TokenIds
from pytest_kimi.mock.speculative import A_MIN, Drafts, SpecCounters, Speculation


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
        cache: PrefixReuse | None = None,
    ) -> None:
        self.cost, self.chunk_size, self.max_running = cost, chunk_size, max_running
        self.cache = cache  # the radix prefix cache; None: --disable-radix-cache
        self.mixed_chunk, self.jitter = mixed_chunk and spec is None, jitter
        self.spec, self.decode_log_interval = spec, decode_log_interval
        self.spec_counters, self.seed = SpecCounters(), seed
        self.pipeline = Pipeline(cost, seed=seed, jitter=jitter, spec=spec)
        self.now, self.steps = 0.0, 0
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []  # admitted: prefilling or decoding
        self.requests: dict[str, SimRequest] = {}
        self.busy_s = 0.0  # cluster seconds a stage spent on batches (GPU utilisation)
        self.prebuilt: list[SimRequest] = []  # decode side: KV landed (or landing), in order
        # prefill side: (request, tokens, started, done: cluster times) per prefilled chunk
        self.on_chunk: OnChunk | None = None

    # -- inputs --------------------------------------------------------------------------
    def add(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, at: float,
        drafts: Drafts | None = None, ids: TokenIds = NO_IDS,
    ) -> SimRequest:  # fmt: skip
        """A request arrives at cluster time ``at`` (not before :attr:`now`); ``drafts``: its
        acceptance when speculating, ``ids``: its tokens for the prefix cache (none: no match)."""
        req = SimRequest(rid, max(1, prompt_tokens), max(1, max_new_tokens), max(at, self.now))
        req.drafts = _drafts(self.spec, self.seed, rid, drafts)
        if len(ids.prompt) == req.prompt_tokens:
            req.tokens, req.output_ids = ids.prompt, ids.answer
        self.requests[rid] = req
        self.waiting.append(req)
        return req

    def add_prebuilt(
        self, rid: str, prompt_tokens: int, max_new_tokens: int, at: float,
        drafts: Drafts | None = None,
    ) -> SimRequest:  # fmt: skip
        """Decode side: a request whose KV lands at ``at`` (not before :attr:`now`), prefilled
        elsewhere; admitted at the next step boundary (FIFO), where its first token comes out."""
        req = SimRequest(rid, max(1, prompt_tokens), max(1, max_new_tokens), max(at, self.now))
        req.prefilled = req.prompt_tokens
        req.drafts = _drafts(self.spec, self.seed, rid, drafts)
        self.requests[rid] = req
        self.prebuilt.append(req)
        self.prebuilt.sort(key=lambda r: r.arrival)  # stable: equal landings keep their order
        return req

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
        if self.cache is not None:
            self.cache.finished(req)

    # -- event loop ------------------------------------------------------------------------
    def next_event_time(self) -> float | None:
        """Cluster time of the next batch completion or batch start, if any."""
        times = [b.done_at for b in self.pipeline.in_flight]
        if self._has_work():
            times.append(max(self.now, self.pipeline.free_at))
        admit = self._next_admission()
        if admit is not None:
            times.append(admit)
        return min(times) if times else None

    def _next_admission(self) -> float | None:
        """When the next landed request can be admitted (its first token comes out then)."""
        if not self.prebuilt or len(self.running) >= self.max_running:
            return None
        return max(self.now, self.prebuilt[0].arrival, self.pipeline.free_at)

    def next_telling_time(self) -> float:
        """The earliest cluster time a request's first or last token can come out (inf: none
        can): an in-flight batch that completes a prompt or a request, or any batch not
        launched yet, which launches at the next event at the soonest and takes at least the
        fastest any batch can go through the pipeline.

        Tokens in between may be emitted late without changing any per-request figure; these
        may not (a live engine on a shared clock waits for the clock here)."""
        times = [b.done_at for b in self.pipeline.in_flight if b.telling(self.spec)]
        nxt = self.next_event_time()
        if nxt is not None:
            times.append(nxt + self.pipeline.fastest_batch())
        admit = self._next_admission()
        if admit is not None:  # a first token, with no batch to wait for
            times.append(admit)
        return min(times, default=math.inf)

    def advance(self, until: float) -> list[TokenEvent]:
        """Process every event up to cluster time ``until``; return emitted tokens."""
        events: list[TokenEvent] = []
        while True:
            nxt = self.next_event_time()
            if nxt is None or nxt > until:
                break
            self.now = max(self.now, nxt)
            for batch in self.pipeline.done_by(self.now):
                events.extend(self._complete(batch))
            if self.pipeline.free_at <= self.now:
                events.extend(self._admit_prebuilt())
            if self.pipeline.free_at <= self.now and not self.pipeline.full:
                self._launch()
        self.now = max(self.now, until)
        return events

    # -- internals ---------------------------------------------------------------------------
    def _has_work(self) -> bool:
        if self.pipeline.full:
            return False
        if any(r.can_decode() or r.can_prefill() for r in self.running):
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
            events.append(req.emit(self.now))
            self._maybe_drop(req)
        return events

    def _launch(self) -> None:
        prefills = self._take_prefill()
        decodes: list[SimRequest] = []
        if not prefills or self.mixed_chunk:
            decodes = [r for r in self.running if r.can_decode()]
        if not prefills and not decodes:
            return
        batch = Batch(prefills, decodes, seq=self.steps, started=self.now)
        if self.cache is not None:
            self.cache.launching(batch, self.running)
        self.steps += 1
        self.busy_s += self.pipeline.launch(batch, self.now)

    def _take_prefill(self) -> list[tuple[SimRequest, int]]:
        budget = self.chunk_size
        out: list[tuple[SimRequest, int]] = []
        for req in self.running:  # a partially prefilled request continues first
            if req.can_prefill() and budget > 0:
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
            if self.cache is not None:
                self.cache.admit(req)  # its cached prefix is not prefilled again
            n = min(budget, req.prompt_tokens - req.prefilled)
            out.append((req, n))
            budget -= n
            chunked = n < req.prompt_tokens
        return out

    def _complete(self, batch: Batch) -> list[TokenEvent]:
        events = batch.complete(self.on_chunk, self.spec, self.spec_counters,
                                self.decode_log_interval)  # fmt: skip
        if self.cache is not None:
            self.cache.batch_done(batch)
        for req, _ in batch.prefills:
            self._maybe_drop(req)
        for req in batch.decodes:
            self._maybe_drop(req)
        return events

    def _maybe_drop(self, req: SimRequest) -> None:
        if req.finished_at is not None and req in self.running:
            self.running.remove(req)


def _drafts(spec: Speculation | None, seed: int, rid: str, drafts: Drafts | None) -> Drafts | None:
    """A request's drafting when its server speculates: as given, else the lowest acceptance
    (a prompt the caller did not show), seeded by the request id."""
    if spec is None:
        return None
    return drafts or Drafts(A_MIN, random.Random(f"{seed}:{rid}").getrandbits(32))
