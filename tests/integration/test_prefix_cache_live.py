"""The mock's prefix cache on the live product path, against its twin: the shipped
``tp32-rr`` and ``tp32-cache-aware`` layouts (TP32 with SGLang's radix cache on, only the
router's policy apart) on the shipped ``agentic`` workload, through the real router.

The real router decides where each turn goes; the replicas' caches decide what it costs. The
twin (:mod:`pytest_kimi.mock.sessiontwin`, with smg's ``cache_aware`` rule in
:mod:`pytest_kimi.mock.routermodel`) predicts, offline, each policy's cache hits and TTFT; the
live run must show them, and the replicas' own ``sglang:cached_tokens_total`` must add up to
what the responses said.

Round robin is exact. smg's ``cache_aware`` is not quite: it draws ties at random and, once its
10-second poll of the replicas' ``/metrics`` has answered (a wall-clock event, which a loaded
machine can move into the run), weighs loads by their reported queues, which the twin cannot
know. So the cache-aware layout is held to the twin's hit rate as tightly as round robin, and
to its TTFT within what its routing choices move (measured: a run with a poll mid-way moved
the mean TTFT 11%), and its replica split only to the balance its spill gate keeps (no
replica below a quarter of the requests: on a loaded machine, where more polls land in the
run, the split moved from the twin's 30/34 to 21/43)."""

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
ROUTED = {"tp32-rr": TOLERANCE, "tp32-cache-aware": 0.15}  # mean TTFT within


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
    assert live["mean_ttft_ms"] == pytest.approx(mean_ttft(predicted) * 1000, rel=ROUTED[layout])
    sent = sorted(c["router_requests"] for c in live["replica_counters"].values())
    by_replica = Counter(t.replica for t in predicted)
    expected = sorted(by_replica.get(i, 0) for i in range(len(sent)))
    assert sum(sent) == sum(expected) == 64
    if layout == "tp32-rr":  # the router sent each replica what the twin sends it
        assert sent == expected
    else:  # which replica a session lands on is smg's draw when loads tie (the docstring)
        assert min(sent) >= 16, sent


def test_the_policies_differ_in_hit_rate_and_ttft_as_the_twin_predicts(agentic_run, twin):
    """Cache-aware finds more of each prompt cached than round robin, which sends a session's
    next turn to the other replica half the time. With a 4K-token system prompt shared by
    every session, every first turn matches the replica that has it; smg's default spill gate
    (64 requests, capped at four over the mean) would never let go of it and all sessions
    would queue there. The shipped layout spills at one request over the mean: sessions
    spread, stay where their conversation is, and every later turn starts sooner than round
    robin's. The twin says so before the run does."""
    rr, ca = (_summary(agentic_run, name) for name in LAYOUTS)
    assert ca["cache_hit_rate"] > rr["cache_hit_rate"] + 0.05
    assert hit_rate(twin["tp32-cache-aware"]) > hit_rate(twin["tp32-rr"]) + 0.05
    for turn in ("1", "2", "3"):
        assert ca["by_turn"][turn]["mean_ttft_ms"] < rr["by_turn"][turn]["mean_ttft_ms"], turn
        predicted = {name: [t for t in twin[name] if t.turn == int(turn)] for name in LAYOUTS}
        assert mean_ttft(predicted["tp32-cache-aware"]) < mean_ttft(predicted["tp32-rr"]), turn
    served = [c["requests"] for c in ca["replica_counters"].values()]
    assert min(served) >= 16  # no replica left idle


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_replicas_cache_counters_add_up_to_the_responses(agentic_run, layout):
    """``sglang:cached_tokens_total`` over the run, read from each replica, equals the sum of
    the responses' ``meta_info.cached_tokens``."""
    live = _summary(agentic_run, layout)
    counted = sum(c["cached_tokens"] for c in live["replica_counters"].values())
    assert counted == live["cached_tokens_total"] > 0
    assert any("cache counters agree" in note for note in live["notes"]), live["notes"]


def test_a_later_turn_finds_its_whole_conversation_where_it_stayed(agentic_run, twin):
    """Under cache-aware a session stays on its replica unless the spill gate moves it: turn
    k then finds turn k-1's prompt and answer cached, all but the answer's last token (its KV
    never computed); a turn moved finds what that replica holds of the session, its system
    prompt at least. Few move: the twin moves at most one in ten; live, where smg's draws and
    its load polls can move more, at most one in four."""
    run = agentic_run / "tp32-cache-aware" / "records.jsonl"
    records = [r for r in map(json.loads, run.read_text().splitlines()) if not r["warmup"]]
    workload = load_cluster(LOCAL).named_workload("agentic")
    turns = {(r["session_id"], r["turn"]): r for r in records}
    whole = {key: r["prompt_tokens"] + workload.output_len - 1 for key, r in turns.items()}
    moved = 0
    for (session, k), r in turns.items():
        if k == 0:
            continue
        earlier = {whole[session, j] for j in range(k)}
        assert r["cached_tokens"] in earlier | {workload.system_prompt_tokens}, (session, k)
        moved += r["cached_tokens"] != whole[session, k - 1]
    where = {(t.session, t.turn): t.replica for t in twin["tp32-cache-aware"]}
    predicted = sum(where[s, k] != where[s, k - 1] for s, k in where if k)
    assert predicted <= 48 // 10 and moved <= 48 // 4, (moved, predicted)  # most stay
