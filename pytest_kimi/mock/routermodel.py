"""The router's choice of replica, for the offline twin: ``round_robin`` and ``cache_aware``.

The live mock runs behind the real router (smg, or sglang-router 0.3), so the twin must choose
as it does to predict what a policy delivers. ``round_robin`` takes the replicas in turn.
``cache_aware`` keeps a radix tree of the texts it sent, each node tagged with the workers it
went to (HTTP: the "approximate string tree", matched in characters, as here), and inserts a
request's text for the worker it chose when it chooses. A request whose longest match is over
``cache_threshold`` of its text is a hit; what then decides is where the releases differ, and
``gate`` chooses:

* ``"mean"``, smg 1.13, the project's pin (``model_gateway/src/policies/cache_aware.rs`` and
  ``least_load.rs`` of its sdist): of the workers holding the longest match, those not over
  the spill gate; the least loaded of them (router in-flight requests, not counting the one
  being routed). A worker is over the gate when its load exceeds ``balance_rel`` times the
  fleet's mean AND the mean plus a margin: ``balance_abs``, capped at two standard
  deviations of a Poisson count at that mean (``ceil(2 sqrt(mean))``) but never under four
  unless ``balance_abs`` is lower. If every holder is over it, the least loaded of the
  workers that are not. A miss: the least loaded worker. smg draws ties at random and, once
  its 10-second poll of the workers' ``/metrics`` answered, weighs loads by their reported
  queues; the twin takes the lowest index and the router's own count, so a live run can
  part from it where loads tie.
* ``"spread"``, smg 1.9 (``lightseekorg/smg``, August 2026) and sglang-router 0.3: whenever
  ``max - min > balance_abs`` and ``max > balance_rel x min`` over the loads, the least
  loaded (then requests sent, then the lowest index), matched or not; else of the workers
  holding the longest match, the one that used it last; a miss, the least loaded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.mock.radixcache import RadixCache

# smg's defaults (bindings/python/src/lib.rs, RouterArgs), which sglang-router 0.3 shares
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
SPILL_MARGIN_FLOOR = 4.0  # smg 1.13: the margin is never under four (unless the gate is)
GATES = ("mean", "spread")


class RoundRobin:
    """Each request to the next replica."""

    def __init__(self, replicas: int) -> None:
        self._next = itertools.cycle(range(replicas))

    def choose(self, text: str) -> int:
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
        balance_abs: float = BALANCE_ABS_THRESHOLD, balance_rel: float = BALANCE_REL_THRESHOLD,
        gate: str = "mean",
    ) -> None:  # fmt: skip
        if gate not in GATES:
            raise ValueError(f"cache_aware spill gate {gate!r}: expected one of {GATES}")
        clock = itertools.count(1)  # one clock: "used last" compares across the trees
        self.workers = [_Worker(RadixCache(2**62, clock)) for _ in range(replicas)]
        self.threshold = cache_threshold
        self.balance_abs, self.balance_rel, self.gate = balance_abs, balance_rel, gate

    def choose(self, text: str) -> int:
        """The worker for a request of ``text``, which its tree then holds."""
        chars = tuple(map(ord, text))
        chosen = self._choose(chars)
        worker = self.workers[chosen]
        worker.tree.insert(chars)
        worker.load += 1
        worker.processed += 1
        return chosen

    def done(self, replica: int) -> None:
        self.workers[replica].load -= 1

    def _choose(self, chars: Sequence[int]) -> int:
        loads = [w.load for w in self.workers]
        everyone = range(len(self.workers))
        if self.gate == "spread" and _spread(loads, self.balance_abs, self.balance_rel):
            return self._least(everyone)
        seen = [w.tree.longest(chars) for w in self.workers]  # (length, last used)
        longest = max(length for length, _ in seen)
        if not chars or longest / len(chars) <= self.threshold:
            return self._least(everyone)
        holders = [i for i in everyone if seen[i][0] == longest]
        if self.gate == "spread":
            return max(holders, key=lambda i: seen[i][1])
        mean = sum(loads) / len(loads)
        under = [i for i in everyone if not spills(loads[i], mean, self.balance_abs,
                                                      self.balance_rel)]  # fmt: skip
        return min([i for i in holders if i in under] or under or everyone,
                   key=lambda i: (loads[i], i))  # fmt: skip

    def _least(self, among: Sequence[int] | range) -> int:
        return min(among, key=lambda i: (self.workers[i].load, self.workers[i].processed, i))


def spills(load: int, mean: float, balance_abs: float, balance_rel: float) -> bool:
    """smg 1.13's spill gate: whether a worker at ``load`` is too far over the fleet's mean."""
    margin = min(balance_abs, max(SPILL_MARGIN_FLOOR, math.ceil(2 * math.sqrt(mean))))
    return load > balance_rel * mean and load > mean + margin


def _spread(loads: Sequence[int], balance_abs: float, balance_rel: float) -> bool:
    """smg 1.9's (and sglang-router 0.3's) imbalance: the busiest far over the idlest."""
    high, low = max(loads), min(loads)
    return high - low > balance_abs and high > low * balance_rel


def router_model(
    policy: str, replicas: int, flags: Mapping[str, Any], package: str = "smg"
) -> RoundRobin | CacheAware:
    """The twin's router for ``policy`` over ``replicas``, set as ``flags`` (the router's
    flags as the cluster file merges them: ``cache-threshold``, ``balance-abs-threshold``,
    ``balance-rel-threshold``) set the real one; ``package`` chooses the spill gate
    (``sglang-router``: the spread rule; smg, or auto, which starts smg first: the mean)."""
    if policy == "round_robin":
        return RoundRobin(replicas)
    if policy != "cache_aware":
        raise ValueError(f"the twin models round_robin and cache_aware, not {policy!r}")
    return CacheAware(
        replicas,
        cache_threshold=float(flags.get("cache-threshold", CACHE_THRESHOLD)),
        balance_abs=float(flags.get("balance-abs-threshold", BALANCE_ABS_THRESHOLD)),
        balance_rel=float(flags.get("balance-rel-threshold", BALANCE_REL_THRESHOLD)),
        gate="spread" if package == "sglang-router" else "mean",
    )
