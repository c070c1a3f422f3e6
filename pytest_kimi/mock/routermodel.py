"""The router's choice of replica, for the offline twin: ``round_robin`` and ``cache_aware``.

The live mock runs behind the real router (smg, or sglang-router 0.3), so the twin must choose
as it does to predict what a policy delivers. ``round_robin`` takes the replicas in turn.
``cache_aware`` (smg's ``model_gateway/src/policies/cache_aware.rs``, HTTP: the "approximate
string tree") keeps a tree per replica of the texts it sent there; when the load is balanced
it sends a request to the replica holding the longest prefix of its text if that prefix is
over ``cache_threshold`` of the text (of the replicas holding it, the one that used it last:
the tree node's last tenant), else to the least loaded (in-flight requests, then requests
sent, then the lowest index); when the load is imbalanced (``max - min >
balance_abs_threshold`` and ``max > balance_rel_threshold x min``), always the least loaded.
The real tree matches characters; this one matches the mock tokenizer's tokens, whole words,
which a text shares or not as a whole: the same prefixes, near the same ratio.

Which release: the rule above is smg 1.9's source (``lightseekorg/smg``, August 2026). smg
1.13 (the project's pin) gates a spill against the fleet's mean load instead: a matched worker
is skipped when its load exceeds the mean by the absolute threshold, capped at two standard
deviations of the in-flight count and never under four, and by the relative one (its
``--balance-abs-threshold`` help). Neither spills at the shipped agentic workload's 8 sessions
on 2 replicas, where the twin matches the live run to 0.1%; with many more in flight per
replica the twin's gate is 1.9's and may spill at another point than 1.13's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimi.mock.radixcache import RadixCache

# smg's defaults (bindings/python/src/lib.rs, RouterArgs), which sglang-router 0.3 shares
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


class RoundRobin:
    """Each request to the next replica."""

    def __init__(self, replicas: int) -> None:
        self._next = itertools.cycle(range(replicas))

    def choose(self, tokens: Sequence[int]) -> int:
        return next(self._next)

    def done(self, replica: int) -> None:
        """A request of ``replica`` finished (round robin does not care)."""


@dataclass
class _Worker:
    tree: RadixCache
    load: int = 0  # in flight
    processed: int = 0  # ever sent


class CacheAware:
    """smg's ``cache_aware`` over ``replicas`` workers (see the module docstring)."""

    def __init__(
        self, replicas: int, cache_threshold: float = CACHE_THRESHOLD,
        balance_abs: int = BALANCE_ABS_THRESHOLD, balance_rel: float = BALANCE_REL_THRESHOLD,
    ) -> None:  # fmt: skip
        clock = itertools.count(1)  # one clock: "used last" compares across the trees
        self.workers = [_Worker(RadixCache(2**62, clock)) for _ in range(replicas)]
        self.threshold = cache_threshold
        self.balance_abs, self.balance_rel = balance_abs, balance_rel

    def choose(self, tokens: Sequence[int]) -> int:
        chosen = self._choose(tokens)
        worker = self.workers[chosen]
        worker.tree.insert(tuple(tokens))
        worker.load += 1
        worker.processed += 1
        return chosen

    def done(self, replica: int) -> None:
        self.workers[replica].load -= 1

    def _choose(self, tokens: Sequence[int]) -> int:
        loads = [w.load for w in self.workers]
        least = min(range(len(self.workers)),
                    key=lambda i: (loads[i], self.workers[i].processed, i))  # fmt: skip
        high, low = max(loads), min(loads)
        if high - low > self.balance_abs and high > low * self.balance_rel:
            return least
        seen = [w.tree.longest(tokens) for w in self.workers]  # (length, last used)
        longest = max(length for length, _ in seen)
        if not tokens or longest / len(tokens) <= self.threshold:
            return least
        return max((i for i, (length, _) in enumerate(seen) if length == longest),
                   key=lambda i: seen[i][1])  # fmt: skip
