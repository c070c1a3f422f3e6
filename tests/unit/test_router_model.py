"""The twin's model of the router's choice (:mod:`pytest_kimi.mock.routermodel`): smg 1.13's
``cache_aware`` rule as its source states it, smg 1.9's before it, and round robin. Whether
the real router chooses so is the live check's (tests/integration/test_prefix_cache_live.py)."""

from __future__ import annotations

import pytest

from pytest_kimi.mock.routermodel import CacheAware, RoundRobin, router_model, spills

SYSTEM = "S" * 400  # a long shared prefix: any text that starts with it is a hit (> 0.3)


def _texts(n: int) -> list[str]:
    """``n`` requests that share ``SYSTEM`` and part right after it (distinct first chars)."""
    return [SYSTEM + chr(0x100 + i) * 20 for i in range(n)]


def test_smg_113s_default_gate_never_spills_two_workers_under_nine_requests():
    # the margin is 64 capped at max(4, ceil(2 sqrt(mean))): 4 over a mean of at most 4
    assert not any(spills(h, (h + o) / 2, 64, 1.5) for h in range(9) for o in range(9 - h))


def test_at_a_gate_of_two_only_the_lopsided_loads_spill():
    # with two workers, holder at h and the other at o: h > 3 o and h - o > 4
    over = {(h, o) for h in range(9) for o in range(8 - h) if spills(h, (h + o) / 2, 2, 1.5)}
    assert over == {(5, 0), (6, 0), (7, 0), (6, 1)}


def test_a_burst_on_one_holder_spills_past_the_gate_then_the_least_loaded_holder_wins():
    router = CacheAware(2, balance_abs=1)
    router.choose(SYSTEM + "warm-up")
    router.done(0)
    # at one over the mean worker 0 takes three; the fourth spills to worker 1, which then
    # holds the prefix too: of two holders the less loaded, ties to the lower index
    assert [router.choose(t) for t in _texts(8)] == [0, 0, 0, 1, 1, 1, 0, 1]


def test_a_sessions_next_turn_goes_where_its_conversation_is_unless_that_worker_is_over():
    router = CacheAware(2, balance_abs=1)
    a, b, c = _texts(3)
    assert [router.choose(t) for t in (a, b, c)] == [0, 0, 0]  # a miss, then hits on worker 0
    router.done(0)  # a's turn ends: loads 2 and 0
    # only worker 0 holds a's conversation; at 2 it is not over 1.5 x 1 and 1 + 1 together
    assert router.choose(a + " answer, next turn") == 0
    # at 3 it is (3 > 1.5 x 1.5 and 3 > 1.5 + 1): b's next turn spills to the idle worker
    assert router.choose(b + " answer, next turn") == 1


def test_smg_19_balances_on_the_spread_and_gives_a_shared_prefix_to_its_last_user():
    router = CacheAware(2, balance_abs=2, balance_rel=1.5, gate="spread")
    # loads 0,0 then 1,0 ... the spread 3 > 2 and 3 > 1.5 x 0 at the fourth: the least loaded
    assert [router.choose(t) for t in _texts(5)] == [0, 0, 0, 1, 1]


def test_round_robin_takes_the_replicas_in_turn_whatever_the_text():
    router = RoundRobin(3)
    assert [router.choose(t) for t in _texts(5)] == [0, 1, 2, 0, 1]


def test_the_twins_router_is_set_as_the_cluster_files_flags_set_the_real_one():
    router = router_model("cache_aware", 2, {"cache-threshold": 0.5, "balance-abs-threshold": 1})
    assert isinstance(router, CacheAware)
    assert (router.threshold, router.balance_abs, router.balance_rel, router.gate) == (
        0.5, 1.0, 1.5, "mean")  # fmt: skip
    assert router_model("cache_aware", 2, {}, "sglang-router").gate == "spread"
    assert isinstance(router_model("round_robin", 2, {}), RoundRobin)
    with pytest.raises(ValueError, match="not 'power_of_two'"):
        router_model("power_of_two", 2, {})
