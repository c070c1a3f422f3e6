"""The mock's radix prefix cache: the tree (match, insert, locks, LRU eviction) and what it
does to the scheduler's requests (cached prefixes skip their prefill compute), in virtual
time, no processes."""

from __future__ import annotations

import pytest

from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.prefixreuse import PrefixReuse
from pytest_kimi.mock.radixcache import RadixCache
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.simrequest import TokenIds


def test_the_longest_cached_prefix_is_found_and_a_node_split_where_it_ends():
    tree = RadixCache(1000)
    tree.insert((1, 2, 3, 4, 5))
    assert tree.size == 5
    matched, node = tree.match((1, 2, 3, 9))
    assert matched == 3 and node.key == (1, 2, 3)  # split: (1, 2, 3) -> (4, 5)
    assert [c.key for c in node.children.values()] == [(4, 5)]
    tree.insert((1, 2, 3, 9, 9))
    assert tree.size == 7  # only the new tokens
    assert tree.match((1, 2, 3, 9, 9, 9))[0] == 5
    assert tree.match((7, 1, 2))[0] == 0
    assert tree.match(())[0] == 0


def test_a_match_of_thousands_of_tokens_compares_slices():
    tree = RadixCache(10**6)
    long = tuple(range(16384))
    tree.insert(long)
    assert tree.match((*long[:10000], -1))[0] == 10000
    assert tree.match(long)[0] == 16384


def test_eviction_takes_the_least_recently_used_unlocked_leaves_then_their_parents():
    tree = RadixCache(1000)
    tree.insert((1, 2, 3, 4))  # shared prefix (1, 2) after the next insert
    tree.insert((1, 2, 5, 6))
    tree.insert((7, 8))
    tree.match((1, 2, 3, 4))  # the first branch is used again: the newest
    freed = tree.evict(2)
    assert freed == 2 and tree.match((1, 2, 5, 6))[0] == 2  # (5, 6) went first
    assert tree.match((7, 8))[0] == 2  # (7, 8) was used just now: (1, 2, 3, 4) is the oldest
    assert tree.evict(4) == 4  # (3, 4), then its parent (1, 2) once childless
    assert tree.match((1, 2, 3, 4))[0] == 0 and tree.size == 2


def test_locked_nodes_never_go():
    tree = RadixCache(1000)
    node = tree.insert((1, 2, 3))
    tree.lock(node)
    assert tree.locked == 3 and tree.evictable == 0
    assert tree.evict(10) == 0 and tree.size == 3
    matched, upper = tree.match((1, 2, 9))  # a split keeps the lock on both halves
    assert matched == 2 and upper.locks == 1
    tree.unlock(node)
    assert tree.locked == 0 and tree.evict(10) == 3 and tree.size == 0


def _sim(cache: PrefixReuse | None, chunk: int = 8192) -> ReplicaSim:
    cost = CostModel(Profile(), tp=32, pp=1, ep=4, gpus_per_node=8)
    return ReplicaSim(cost, chunk_size=chunk, max_running=64, cache=cache)


def _ids(prompt: tuple[int, ...], n: int, salt: int) -> TokenIds:
    return TokenIds(prompt, tuple(100 + salt + i for i in range(n)))


def _run_one(sim: ReplicaSim, rid: str, ids: TokenIds, at: float):
    sim.advance(at)  # as the engine does: the model reaches the arrival first
    req = sim.add(rid, len(ids.prompt), len(ids.answer), at, ids=ids)
    while req.finished_at is None:
        nxt = sim.next_event_time()
        assert nxt is not None
        sim.advance(nxt)
    return req


def test_a_repeated_prompt_skips_its_cached_prefill_and_reaches_its_first_token_sooner():
    prompt = tuple(range(4, 12004))  # 12,000 tokens: two 8K chunks uncached
    sim = _sim(PrefixReuse(10**6))
    first = _run_one(sim, "a", _ids(prompt, 8, 0), 0.0)
    again = _run_one(sim, "b", _ids(prompt, 8, 1), first.finished_at + 1.0)
    assert first.cached == 0 and again.cached == len(prompt) - 1  # never the last token
    ttft = [r.first_token_at - r.arrival for r in (first, again)]
    assert ttft[1] < ttft[0] / 5, ttft
    # without the cache the same two requests take the same time each
    plain = _sim(None)
    a = _run_one(plain, "a", _ids(prompt, 8, 0), 0.0)
    b = _run_one(plain, "b", _ids(prompt, 8, 1), a.finished_at + 1.0)
    assert b.cached == 0
    assert b.first_token_at - b.arrival == pytest.approx(a.first_token_at - a.arrival)


def test_a_next_turn_matches_the_previous_prompt_and_answer():
    """A conversation resent with the answer the server gave: everything up to the new
    turn is cached (the answer's last token never had its KV computed)."""
    sim = _sim(PrefixReuse(10**6))
    turn0 = tuple(range(4, 1004))
    first = _run_one(sim, "t0", _ids(turn0, 16, 0), 0.0)
    turn1 = turn0 + first.output_ids + (7, 7, 7)
    second = _run_one(sim, "t1", _ids(turn1, 16, 1), first.finished_at + 1.0)
    assert second.cached == len(turn0) + 16 - 1


def test_a_prompt_is_shared_once_prefilled_while_its_request_still_decodes():
    """``cache_unfinished_req``: after its prefill, a running request's prompt is in the tree."""
    sim = _sim(PrefixReuse(10**6))
    prompt = tuple(range(4, 2004))
    long_answer = _ids(prompt, 400, 0)
    a = sim.add("a", len(prompt), 400, 0.0, ids=long_answer)
    while a.first_token_at is None:
        sim.advance(sim.next_event_time())
    b = _run_one(sim, "b", _ids((*prompt, 9), 4, 1), sim.now)
    assert a.finished_at is None and b.cached == len(prompt)


def test_a_small_pool_evicts_the_oldest_conversation_first():
    pool = PrefixReuse(3000)
    sim = _sim(pool)
    old = _run_one(sim, "old", _ids(tuple(range(4, 1504)), 4, 0), 0.0)
    new = _run_one(sim, "new", _ids(tuple(range(2000, 3500)), 4, 1), old.finished_at)
    again = _run_one(sim, "again", _ids((*tuple(range(2000, 3500)), 5), 4, 2), new.finished_at)
    assert again.cached == 1500  # the newer conversation stayed ...
    gone = _run_one(sim, "gone", _ids(tuple(range(4, 1504)), 4, 3), again.finished_at)
    assert gone.cached < 1499  # ... the older one was evicted to make room
    assert pool.tree.size <= 3000


def test_requests_without_token_ids_neither_match_nor_fill_the_cache():
    pool = PrefixReuse(10**6)
    sim = _sim(pool)
    req = sim.add("x", 500, 4, 0.0)
    while req.finished_at is None:
        sim.advance(sim.next_event_time())
    assert req.cached == 0 and pool.tree.size == 0


def test_the_prefill_log_gives_sglangs_cache_hit_rate_of_the_last_prefill_batch():
    pool = PrefixReuse(10**6)
    sim = _sim(pool)
    prompt = tuple(range(4, 1004))
    first = _run_one(sim, "a", _ids(prompt, 4, 0), 0.0)
    assert pool.log.hit_rate == 0.0 and pool.log.computed == 1000
    _run_one(sim, "b", _ids((*prompt, 9, 9), 4, 1), first.finished_at)
    assert pool.log.hit == 1000 and pool.log.computed == 2  # + the last token: 1 + 1
    assert pool.log.hit_rate == pytest.approx(1000 / 1002)
