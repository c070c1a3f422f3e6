"""The mock's prefix cache on the live product path, against its twin: the shipped
``tp32-rr`` and ``tp32-cache-aware`` layouts (TP32 with SGLang's radix cache on, only the
router's policy apart) on the shipped ``agentic`` workload, through the real router.

The real router decides where each turn goes; the replicas' caches decide what it costs. The
twin (:mod:`pytest_kimi.mock.sessiontwin`, with smg's ``cache_aware`` rule in
:mod:`pytest_kimi.mock.routermodel`) predicts, offline, each policy's cache hits and TTFT; the
live run must show them, and the replicas' own ``sglang:cached_tokens_total`` must add up to
what the responses said."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.mock import mission
from pytest_kimi.mock.sessiontwin import hit_rate, mean_ttft
from pytest_kimi.testing.processes import shipped_mission

ROOT = Path(__file__).parents[2]
LOCAL = ROOT / "clusters" / "local.yaml"
LAYOUTS = ("tp32-rr", "tp32-cache-aware")
TOLERANCE = 0.02  # live within 2% of the twin (the shared clock keeps the client out)


@pytest.fixture(scope="module")
def agentic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mission's command on the mock with both layouts and ``--kimi-workload agentic``, at
    5x the shipped time scale (cluster time does not depend on it); its run folder."""
    work = tmp_path_factory.mktemp("prefix-cache")
    return shipped_mission(work, f"--layout={','.join(LAYOUTS)}", "--kimi-workload=agentic")


def _summary(run: Path, layout: str) -> dict:
    return json.loads((run / layout / "summary.json").read_text())


@pytest.fixture(scope="module")
def twin() -> dict:
    cluster = load_cluster(LOCAL)
    return {name: mission.simulate_sessions_layout(cluster, name, "agentic") for name in LAYOUTS}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_policys_cache_hits_and_ttft_are_what_the_twin_predicts(agentic_run, twin, layout):
    live = _summary(agentic_run, layout)
    predicted = twin[layout]
    assert live["completed"] == len(predicted) == 64
    assert live["cache_hit_rate"] == pytest.approx(hit_rate(predicted), rel=TOLERANCE)
    assert live["mean_ttft_ms"] == pytest.approx(mean_ttft(predicted) * 1000, rel=TOLERANCE)
    # the router sent each replica what the twin's model of its policy sends it
    sent = {name: c["router_requests"] for name, c in live["replica_counters"].items()}
    by_replica = Counter(t.replica for t in predicted)
    assert sorted(sent.values()) == sorted(by_replica.get(i, 0) for i in range(len(sent)))


def test_the_policies_differ_in_hit_rate_and_ttft_as_the_twin_predicts(agentic_run, twin):
    """Cache-aware finds more of each prompt cached than round robin, which sends a session's
    next turn to the other replica half the time; with a 4K-token system prompt shared by
    every session, every first turn matches the replica that has it (over the 0.3 threshold)
    and the load never trips the 64-request imbalance rule, so all sessions land on one
    replica and wait for it: TTFT rises. The twin says so before the run does."""
    rr, ca = (_summary(agentic_run, name) for name in LAYOUTS)
    assert ca["cache_hit_rate"] > rr["cache_hit_rate"] + 0.05
    assert hit_rate(twin["tp32-cache-aware"]) > hit_rate(twin["tp32-rr"]) + 0.05
    live_ttft = ca["mean_ttft_ms"] / rr["mean_ttft_ms"] - 1
    twin_ttft = mean_ttft(twin["tp32-cache-aware"]) / mean_ttft(twin["tp32-rr"]) - 1
    assert abs(twin_ttft) > 2 * TOLERANCE  # the model says it matters ...
    assert live_ttft * twin_ttft > 0 and abs(live_ttft - twin_ttft) <= 2 * TOLERANCE  # ... so
    served = [c["requests"] for c in ca["replica_counters"].values()]
    assert sorted(served) == [0, 64]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_replicas_cache_counters_add_up_to_the_responses(agentic_run, layout):
    """``sglang:cached_tokens_total`` over the run, read from each replica, equals the sum of
    the responses' ``meta_info.cached_tokens``."""
    live = _summary(agentic_run, layout)
    counted = sum(c["cached_tokens"] for c in live["replica_counters"].values())
    assert counted == live["cached_tokens_total"] > 0
    assert any("cache counters agree" in note for note in live["notes"]), live["notes"]


def test_on_one_replica_each_turn_finds_the_whole_conversation_before_it_cached(agentic_run):
    """Under cache-aware every session stays on its replica: turn k's cached tokens are
    turn k-1's prompt and answer, all but the answer's last token (its KV never computed)."""
    live = _summary(agentic_run, "tp32-cache-aware")
    by_turn, sessions = live["by_turn"], 16
    output_len = load_cluster(LOCAL).named_workload("agentic").output_len
    for k in (1, 2, 3):
        before = by_turn[str(k - 1)]["total_input_tokens"] + sessions * (output_len - 1)
        assert by_turn[str(k)]["cached_tokens_total"] == before, k
