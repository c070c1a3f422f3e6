"""A replica's prefix cache over its requests' lives: SGLang's calls into ``RadixCache``.

The scheduler (:mod:`pytest_kimi.mock.scheduler`) calls :meth:`PrefixReuse.admit` when a
request leaves the waiting queue (SGLang matches the prefix there, in
``get_new_batch_prefill``: a request admitted in the same batch as another with the same
prefix does not share it yet), :meth:`PrefixReuse.chunk_done` after each of its prefill
chunks, :meth:`PrefixReuse.finished` when it ends, and :meth:`PrefixReuse.make_room` before
a batch takes new KV slots. A request without token ids (``SimRequest.tokens`` empty: the
caller did not know them) is neither matched nor inserted.

What a replica counts for its ``/metrics`` lives here too: SGLang's scheduler logs each
prefill batch's new and cached tokens (``log_prefill_stats``), from which it sets
``sglang:cache_hit_rate``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kimi.mock.radixcache import Node, RadixCache
from pytest_kimi.mock.simrequest import SimRequest

if TYPE_CHECKING:
    from pytest_kimi.mock.pipeline import Batch


@dataclass
class PrefillLog:
    """The last prefill batch's tokens, as SGLang's scheduler logs them."""

    computed: int = 0  # the last batch's prompt tokens prefilled
    hit: int = 0  # the last batch's prompt tokens found cached (its new requests')

    @property
    def hit_rate(self) -> float:
        """``sglang:cache_hit_rate``: the last prefill batch's cached / (cached + computed)."""
        total = self.hit + self.computed
        return self.hit / total if total else 0.0


class PrefixReuse:
    """One replica's radix cache over a KV pool of ``capacity`` tokens (see the module).

    ``whole_answer``: a finished request's answer goes into the tree with its last token
    (SGLang 0.5.9, measured: a conversation resent with its answer finds every answer token
    cached) or without it (0.5.23: the last token's KV is never computed, and
    ``cache_finished_req`` inserts only up to ``kv_committed_len``)."""

    def __init__(self, capacity: int, whole_answer: bool = False) -> None:
        self.tree = RadixCache(capacity)
        self.log = PrefillLog()
        self.whole_answer = whole_answer

    def admit(self, req: SimRequest) -> None:
        """Match the prompt's longest cached prefix (all but its last token), lock it, and
        start the request's prefill after it."""
        if not req.tokens:
            return
        matched, node = self.tree.match(req.tokens[: len(req.tokens) - 1])
        self.tree.lock(node)
        req.cache_node, req.cached, req.in_tree = node, matched, matched
        req.prefilled = max(req.prefilled, matched)

    def launching(self, batch: Batch, running: Iterable[SimRequest]) -> None:
        """A batch is about to take its KV slots: room made for them, and (a prefill batch)
        its computed and cached tokens logged."""
        self.make_room(running, sum(n for _, n in batch.prefills) + len(batch.decodes))
        self._log(batch.prefills)

    def batch_done(self, batch: Batch) -> None:
        """A batch ended: each prompt's computed part into the tree; each request that
        finished, its prompt and answer."""
        for req, _ in batch.prefills:
            if req.finished_at is None:
                self.chunk_done(req)
        for req in [*(r for r, _ in batch.prefills), *batch.decodes]:
            if req.finished_at is not None:
                self.finished(req)  # once: it lets go of its node

    def _log(self, chunks: list[tuple[SimRequest, int]]) -> None:
        """Log a prefill batch's computed and cached tokens (a request's cached ones with
        its first chunk)."""
        if not chunks:
            return
        self.log.computed = sum(n for _, n in chunks)
        self.log.hit = sum(r.cached for r, _ in chunks if r.prefilled == r.cached)

    def chunk_done(self, req: SimRequest) -> None:
        """Its computed prompt goes into the tree so that others can match it
        (``cache_unfinished_req``); its lock moves to the new end."""
        if req.tokens and req.cache_node is not None and req.finished_at is None:
            self._move(req, self.tree.insert(req.tokens[: req.prefilled]), req.prefilled)

    def finished(self, req: SimRequest) -> None:
        """Its prompt and answer go into the tree, all but the last answer token (SGLang
        never computes that one's KV), and its lock goes (``cache_finished_req``)."""
        node = req.cache_node
        if not req.tokens or not isinstance(node, Node):
            return
        done = min(req.prefilled, req.prompt_tokens)
        kept = req.generated if self.whole_answer else max(0, req.generated - 1)
        answer = req.output_ids[:kept] if done == req.prompt_tokens else ()
        self.tree.insert(req.tokens[:done] + answer)  # unlocked: evictable from now on
        self.tree.unlock(node)
        req.cache_node, req.in_tree = None, 0

    def flush(self) -> None:
        """Empty the tree (``/flush_cache`` on an idle server)."""
        self.tree = RadixCache(self.tree.capacity)

    def make_room(self, running: Iterable[SimRequest], new_tokens: int) -> None:
        """Before a batch takes ``new_tokens`` KV slots: if the pool (the tree plus what
        running requests hold alone) would overflow, evict unlocked leaves."""
        own = sum(max(0, r.prefilled + r.generated - r.in_tree) for r in running
                  if r.finished_at is None)  # fmt: skip
        over = self.tree.size + own + new_tokens - self.tree.capacity
        if over > 0:
            self.tree.evict(over)

    def _move(self, req: SimRequest, node: Node, in_tree: int) -> None:
        old = req.cache_node
        self.tree.lock(node)
        if isinstance(old, Node):
            self.tree.unlock(old)
        req.cache_node, req.in_tree = node, in_tree
