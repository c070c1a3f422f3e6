"""The mock's performance model and scheduler, in virtual time, and its fault-knob state (no
processes, no sleeps)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from pytest_kimi.mock.faults import FaultError, Faults
from pytest_kimi.mock.healthgate import HealthGate
from pytest_kimi.mock.perfmodel import CostModel, Prefill, Profile
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.twin import simulate

LOCAL = Path(__file__).resolve().parents[2] / "clusters" / "local.yaml"


def _cost(tp: int, pp: int, profile: Profile | None = None) -> CostModel:
    return CostModel(profile or Profile(), tp=tp, pp=pp, ep=4, gpus_per_node=8)


def test_tp_allreduce_costs_more_once_the_group_crosses_nodes():
    intra, inter = _cost(8, 4), _cost(16, 2)
    # same message, but TP16 spans two nodes: inter-node latency and bandwidth apply
    assert inter.allreduce_time(1) > intra.allreduce_time(1)
    assert _cost(1, 32).allreduce_time(1000) == 0.0


def test_allreduce_latency_is_nccls_ring_model_with_its_tables():
    """NCCL 2.20.3's Ring model (src/graph/tuning.cc): baseLat + a hwLat per ring step, PCI
    inside a node, NET for the 2 x nodes inter-node steps, scaled by the measured factor. One
    token picks LL (bus bandwidth a quarter of the link's); an 8K-token chunk picks Simple,
    whose multi-node latency carries the 1.4 plateau."""
    p = Profile()
    k = p.nccl_latency_factor
    one_token = 7168 * 2
    # TP32 over 4 nodes: 62 steps, 8 of them inter-node; the ring runs at the network's speed
    tp32_ll = k * (6.6 + 54 * 1.0 + 8 * 2.7) / 1e6 + 62 / 32 * one_token / (12.5e9 / 4)
    assert _cost(32, 1).allreduce_time(1) == pytest.approx(tp32_ll)
    tp4_ll = k * (6.6 + 6 * 1.0) / 1e6 + 6 / 4 * one_token / (63e9 / 4)
    assert _cost(4, 8).allreduce_time(1) == pytest.approx(tp4_ll)
    chunk = 8192 * one_token
    tp32_simple = k * 1.4 * (8.4 + 54 * 5.7 + 8 * 14.0) / 1e6 + 62 / 32 * chunk / 12.5e9
    assert _cost(32, 1).allreduce_time(8192) == pytest.approx(tp32_simple)


def test_latency_factor_scales_every_collective_latency_alike():
    """One measured factor for all of NCCL's latencies, not a knob per link or layout:
    doubling it adds each layout's own NCCL latency once more (LL still the pick)."""
    k = Profile().nccl_latency_factor
    slow = Profile(nccl_latency_factor=2 * k)
    for tp, pp, nccl_us in ((32, 1, 6.6 + 54 * 1.0 + 8 * 2.7), (4, 8, 6.6 + 6 * 1.0)):
        extra = _cost(tp, pp, slow).allreduce_time(1) - _cost(tp, pp).allreduce_time(1)
        assert extra == pytest.approx(k * nccl_us / 1e6)
    hop = _cost(4, 8, slow).hop_time(1, 1) - _cost(4, 8).hop_time(1, 1)  # stage 1 -> 2: a node
    assert hop == pytest.approx(k * (6.6 + 2.7) / 1e6)


def test_step_overhead_is_paid_once_per_stage_by_every_layout():
    """Not PP8's private knob: one more millisecond per stage adds 1 ms to TP32's step and
    8 ms to a decode batch's trip through PP8's eight stages."""
    slow = Profile(step_overhead_ms=Profile().step_overhead_ms + 1.0)
    contexts = [16384] * 4
    tp32 = _cost(32, 1, slow).stage_time([], contexts) - _cost(32, 1).stage_time([], contexts)
    pp8 = 8 * (_cost(4, 8, slow).stage_time([], contexts) - _cost(4, 8).stage_time([], contexts))
    assert tp32 == pytest.approx(1e-3) and pp8 == pytest.approx(8e-3)


def test_decode_step_through_all_pp_stages_is_slower_than_tp32():
    tp32, pp8 = _cost(32, 1), _cost(4, 8)
    contexts = [16384] * 4
    tp32_step = tp32.stage_time([], contexts)
    pp8_step = sum(pp8.stage_time([], contexts) for _ in range(8)) + sum(
        pp8.hop_time(4, s) for s in range(7)
    )
    assert pp8_step > tp32_step


def test_prefill_stage_of_pp8_is_shorter_than_a_tp32_chunk():
    """PP pipelines chunks: its throughput is set by one stage, TP32's by the whole model."""
    chunk = [Prefill(8192, 0)]
    assert _cost(4, 8).stage_time(chunk, []) < _cost(32, 1).stage_time(chunk, [])


def test_hop_crosses_a_node_every_second_stage_for_tp4():
    pp8 = _cost(4, 8)
    # stages 0,1 on node 0: hop 0->1 is intra-node, 1->2 crosses nodes
    assert pp8.hop_time(1, 1) > pp8.hop_time(1, 0)  # small message: latency decides


def test_profile_rejects_unknown_and_non_numeric_fields():
    with pytest.raises(ValueError, match="gpu_tflop: unknown profile field"):
        Profile.from_mapping({"gpu_tflop": 1})
    with pytest.raises(ValueError, match="layers: expected a number"):
        Profile.from_mapping({"layers": "61"})
    assert Profile.from_mapping({"layers": 30}).layers == 30


def _sim(tp: int = 32, pp: int = 1, chunk: int = 8192, mixed: bool = False) -> ReplicaSim:
    return ReplicaSim(_cost(tp, pp), chunk_size=chunk, max_running=256, mixed_chunk=mixed)


def _drain(sim: ReplicaSim) -> None:
    while (t := sim.next_event_time()) is not None:
        sim.advance(t)


def test_prompt_is_prefilled_in_chunks_and_first_token_follows_the_last_chunk():
    sim = _sim()
    sim.add("a", 20000, 3, 0.0)
    sim.advance(0.0)
    assert sim.steps == 1  # first chunk of 8192 is in flight
    _drain(sim)
    req = sim.requests["a"]
    # 20000 tokens = chunks of 8192, 8192, 3616, then 2 decode steps
    assert sim.steps == 5
    assert len(req.token_times) == 3
    assert req.finished_at == req.token_times[-1]
    assert req.token_times == sorted(req.token_times)


def test_prefill_has_priority_over_decode_without_mixed_chunk():
    sim = _sim()
    sim.add("a", 100, 50, 0.0)
    _drain_until_tokens(sim, "a", 2)
    sim.add("b", 16384, 1, sim.now)
    before = len(sim.requests["a"].token_times)
    t_first_b = None
    while t_first_b is None:
        sim.advance(sim.next_event_time())
        t_first_b = sim.requests["b"].first_token_at
    # while b prefilled (2 chunks) a did not get a token (at most the one in flight)
    assert len(sim.requests["a"].token_times) <= before + 1


def test_mixed_chunk_lets_decodes_ride_along():
    sim = _sim(mixed=True)
    sim.add("a", 100, 50, 0.0)
    _drain_until_tokens(sim, "a", 2)
    sim.add("b", 16384, 1, sim.now)
    before = len(sim.requests["a"].token_times)
    while sim.requests["b"].first_token_at is None:
        sim.advance(sim.next_event_time())
    assert len(sim.requests["a"].token_times) >= before + 2


def _drain_until_tokens(sim: ReplicaSim, rid: str, n: int) -> None:
    while len(sim.requests[rid].token_times) < n:
        sim.advance(sim.next_event_time())


def test_pp_keeps_several_micro_batches_in_flight():
    sim = _sim(tp=4, pp=8)
    for i in range(3):
        sim.add(f"r{i}", 16384, 4, 0.0)
    sim.advance(0.0)
    t = sim.next_event_time()
    sim.advance(t)  # stage 0 frees before the first batch leaves the last stage
    assert len(sim.pipeline.in_flight) >= 2


def test_max_running_caps_admission():
    sim = ReplicaSim(_cost(32, 1), chunk_size=8192, max_running=2)
    for i in range(4):
        sim.add(f"r{i}", 10, 4, 0.0)
    sim.advance(0.0)
    assert len(sim.running) == 2 and len(sim.waiting) == 2
    _drain(sim)
    assert all(r.finished_at is not None for r in sim.requests.values())


def test_abort_frees_the_request():
    sim = _sim()
    sim.add("a", 10, 100, 0.0)
    _drain_until_tokens(sim, "a", 3)
    sim.abort("a")
    _drain(sim)
    assert len(sim.requests["a"].token_times) <= 4
    assert not sim.running


def _dp2(tp: int, pp: int, **kw) -> tuple[np.ndarray, np.ndarray, float]:
    lens = [16384 + 97 * (i % 7) - 300 for i in range(40)]
    run = simulate(
        Profile(**kw), tp=tp, pp=pp, ep=4, gpus_per_node=8, replicas=2,
        num_requests=40, input_lens=lens, output_len=512, concurrency=8,
    )  # fmt: skip
    ttft = np.array([r.first_token_at - r.arrival for r in run.requests])
    e2e = np.array([r.finished_at - r.arrival for r in run.requests])
    return ttft, (e2e - ttft) / 511, run.duration


def test_twin_reproduces_the_seed_trade_off_directions():
    """Seed: PP8 has lower TTFT p95, higher TPOT (mean, median, p95), longer duration."""
    tp_ttft, tp_tpot, tp_dur = _dp2(32, 1)
    pp_ttft, pp_tpot, pp_dur = _dp2(4, 8)
    assert np.percentile(pp_ttft, 95) < np.percentile(tp_ttft, 95)
    assert pp_tpot.mean() > tp_tpot.mean()
    assert np.median(pp_tpot) > np.median(tp_tpot)
    assert np.percentile(pp_tpot, 95) > np.percentile(tp_tpot, 95)
    assert pp_dur > tp_dur


def test_a_slow_client_turnaround_locks_tp32_replicas_into_waves():
    """Why the live mock's TP32 TTFT median sat near 13.6 s while the twin said 5.1 s: the
    client's turnaround (12 ms wall, measured) times the time scale (40) is ~0.5 s of cluster
    time before a follow-up arrives. By then the other replica has finished its own wave, so
    follow-ups never land mid-decode, the replicas never desynchronise, and every request
    queues behind its wave's 16K prefills. An instant client breaks the waves."""
    profile = Profile.from_mapping(yaml.safe_load(LOCAL.read_text())["mock"]["profile"])
    lens = [16384 + 97 * (i % 7) - 300 for i in range(40)]

    def ttft(reaction_s: float) -> np.ndarray:
        run = simulate(
            profile, tp=32, pp=1, ep=4, gpus_per_node=8, replicas=2, num_requests=40,
            input_lens=lens, output_len=512, concurrency=8, reaction_s=reaction_s,
        )  # fmt: skip
        return np.array([r.first_token_at - r.arrival for r in run.requests])

    instant, slow = ttft(0.0), ttft(0.5)
    assert np.median(instant) < 6.0  # most requests prefilled alone (~5 s for 16K)
    assert np.median(slow) > 12.0  # waves: behind two to four 16K prefills
    assert np.median(ttft(0.005)) < 6.0  # a real cluster's few ms of turnaround do not lock


def test_simulation_is_deterministic_for_a_seed_even_with_jitter():
    a = _dp2(32, 1, jitter=0.05)
    b = _dp2(32, 1, jitter=0.05)
    c = _dp2(32, 1, jitter=0.0)
    assert np.array_equal(a[0], b[0]) and a[2] == b[2]
    assert a[2] != c[2]


# -- fault knobs ------------------------------------------------------------------------------


def test_health_gate_holds_requests_until_a_late_probe_then_lets_all_through():
    async def scenario() -> None:
        gate = HealthGate()
        first, second = asyncio.create_task(gate.hold()), asyncio.create_task(gate.hold())
        await asyncio.sleep(0)  # both reach the gate
        assert gate.held == 2 and not first.done() and not second.done()
        gate.probe_answered_late(3.0, client_gone=True)
        await asyncio.gather(first, second)
        assert gate.held == 0
        await asyncio.wait_for(gate.hold(), 5)  # open for good: no wait, nothing counted
        assert gate.held == 0

    asyncio.run(scenario())


def test_health_gate_never_probed_releases_at_its_limit_and_says_so(caplog):
    async def scenario() -> None:
        gate = HealthGate(limit_s=0)
        await gate.hold()
        assert gate.opened.is_set() and gate.held == 0

    with caplog.at_level(logging.ERROR, logger="sglang.mock"):
        asyncio.run(scenario())
    assert "no /health probe was answered late" in caplog.text


def test_hold_needs_a_late_health_and_a_bad_update_changes_nothing(caplog):
    faults = Faults()
    with pytest.raises(FaultError, match="hold_until_late_health needs health=slow:S"):
        faults.update({"hold_until_late_health": "true"})
    assert faults.hold_until_late_health is False
    faults.update({"health": "busy_slow:3", "hold_until_late_health": "true"})
    assert faults.hold_until_late_health is True and faults.health_delay(busy=True) == 3.0
    with caplog.at_level(logging.ERROR, logger="sglang.mock"), pytest.raises(FaultError):
        faults.update({"log": "oom", "health": "ok", "error_rate": 1})
    assert faults.health == "busy_slow:3" and faults.error_rate == 0.0
    assert "out of memory" not in caplog.text  # all or nothing: not even the log line
    faults.update({"health": "ok", "hold_until_late_health": False})
    assert faults.health == "ok"
