"""SGLang's radix prefix cache, as one replica's mock scheduler keeps it.

A tree of token-id sequences (page size 1, SGLang's default): each edge holds a run of tokens
whose KV cache the replica still has. A request arriving matches the longest prefix of its
prompt in the tree (never the prompt's last token: SGLang computes that one to sample from,
``Req.init_next_round_input``) and skips that much prefill; the nodes it matched are locked
while it runs. After each prefill chunk its computed prompt goes into the tree
(``cache_unfinished_req``), so a request that arrives while it still decodes can share it,
and when it finishes its prompt and answer go in (``cache_finished_req``: every token whose
KV was computed) and its lock is let go.

The tree shares the replica's KV pool (``max_total_num_tokens``) with what running requests
hold alone; when the pool would overflow, unlocked leaves go, least recently used first
(``--radix-eviction-policy lru``, SGLang's default), a parent following once its last child
has gone (``RadixCache.evict``). A logical clock orders the uses, so a run is repeatable.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

Tokens = tuple[int, ...]


@dataclass(eq=False)
class Node:
    """A run of tokens (``key``) after its parent's; ``locks``: running requests using it."""

    key: Tokens
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)
    locks: int = 0
    used: int = 0  # the logical time of its last match or insert


def _common(a: Tokens, b: Sequence[int], start: int) -> int:
    """How many of ``a``'s tokens equal ``b``'s from ``start`` on."""
    n = min(len(a), len(b) - start)
    if a[:n] == tuple(b[start : start + n]):
        return n
    lo, hi = 0, n  # a[:lo] matches, a[:hi] does not: bisect on slice comparisons (C speed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == tuple(b[start : start + mid]):
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache:
    """One replica's prefix cache over a KV pool of ``capacity`` tokens."""

    def __init__(self, capacity: int, clock: Iterator[int] | None = None) -> None:
        """``clock``: the logical clock that orders uses (shared by trees compared with
        each other; default: this tree's own)."""
        self.capacity = capacity
        self.root = Node((), None)
        self.size = 0  # tokens in the tree
        self.locked = 0  # of which some running request uses
        self._clock = clock or itertools.count(1)

    # -- reading ---------------------------------------------------------------------------
    def match(self, tokens: Sequence[int]) -> tuple[int, Node]:
        """The longest cached prefix of ``tokens``: its length and its last node (split so
        that it ends there). Every node on the way counts as used now."""
        node, i, now = self.root, 0, next(self._clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _common(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.used = now
            node, i = child, i + n
        return i, node

    def longest(self, tokens: Sequence[int]) -> tuple[int, int]:
        """The longest cached prefix of ``tokens`` and when its last node was used, changing
        nothing (a router's look at its tree)."""
        node, i, used = self.root, 0, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _common(child.key, tokens, i)
            node, i, used = child, i + n, child.used
            if n < len(child.key):
                break
        return i, used

    @property
    def evictable(self) -> int:
        return self.size - self.locked

    # -- changing --------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int]) -> Node:
        """Put ``tokens`` in the tree (what is there already stays); the node they end at."""
        matched, node = self.match(tokens)
        if matched < len(tokens):
            leaf = Node(tuple(tokens[matched:]), node, used=next(self._clock))
            node.children[leaf.key[0]] = leaf
            self.size += len(leaf.key)
            node = leaf
        return node

    def lock(self, node: Node) -> None:
        """A running request uses ``node`` and every node above it: none may go."""
        while node.parent is not None:
            if node.locks == 0:
                self.locked += len(node.key)
            node.locks += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node.parent is not None:
            node.locks -= 1
            if node.locks == 0:
                self.locked -= len(node.key)
            node = node.parent

    def evict(self, tokens: int) -> int:
        """Drop unlocked leaves, least recently used first, until ``tokens`` tokens are
        freed or nothing more may go; how many were freed."""
        heap = [(leaf.used, id(leaf), leaf) for leaf in self._leaves() if leaf.locks == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            freed += len(leaf.key)
            if parent.parent is not None and not parent.children and parent.locks == 0:
                heapq.heappush(heap, (parent.used, id(parent), parent))
        return freed

    # -- internals -------------------------------------------------------------------------
    def _split(self, child: Node, n: int) -> Node:
        """Cut ``child``'s key after ``n`` tokens; the new upper node (locks kept: a lock on
        ``child`` covers the path through it)."""
        parent = child.parent
        assert parent is not None
        upper = Node(child.key[:n], parent, locks=child.locks, used=child.used)
        parent.children[upper.key[0]] = upper
        child.key, child.parent = child.key[n:], upper
        upper.children[child.key[0]] = child
        return upper

    def _leaves(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out
