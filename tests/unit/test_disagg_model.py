"""The mock's prefill/decode disaggregation, in parts: KV bytes and links, the decode side's
prebuilt admission, the prefill side's chunk notices, the stage histogram, the bootstrap
fields and the bootstrap server's routes."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from pytest_kimi.mock.bootstrap import bootstrap_app
from pytest_kimi.mock.disagg import Bootstrap, BootstrapError
from pytest_kimi.mock.kvlink import Link, kv_bytes, side_bandwidth
from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.stagelatency import STAGE_BUCKETS, StageLatencies

# Kimi K2's config.json: kv_lora_rank 512, qk_rope_head_dim 64, 61 layers; BF16 KV cache
K2_LATENT, K2_ROPE, K2_LAYERS, BF16 = 512, 64, 61, 2


def _sim(tp: int = 32, pp: int = 1, max_running: int = 256) -> ReplicaSim:
    cost = CostModel(Profile(), tp=tp, pp=pp, ep=4, gpus_per_node=8)
    return ReplicaSim(cost, chunk_size=8192, max_running=max_running)


def _drain(sim: ReplicaSim) -> None:
    while (t := sim.next_event_time()) is not None:
        sim.advance(t)


def test_kv_bytes_are_one_latent_copy_per_decode_rank():
    per_token = (K2_LATENT + K2_ROPE) * BF16 * K2_LAYERS  # 70,272 B
    assert kv_bytes(Profile(), 16384, decode_tp=32) == 16384 * per_token * 32
    assert kv_bytes(Profile(), 16384, decode_tp=8) * 4 == kv_bytes(Profile(), 16384, 32)


def test_a_side_moves_its_nodes_bandwidth_together():
    assert side_bandwidth(Profile(), 4) == 4 * Profile().inter_node_bw_gbs * 1e9
    assert side_bandwidth(Profile(inter_node_bw_gbs=50.0), 1) == 50e9


def test_a_link_serves_chunks_first_come_first_served():
    link = Link(10.0)  # bytes per second
    a = link.send(0.0, 20.0)
    b = link.send(1.0, 10.0)  # ready while a is still on the link
    c = link.send(10.0, 10.0)  # ready after the link went idle
    assert (a.start, a.end) == (0.0, 2.0)
    assert (b.start, b.end) == (2.0, 3.0)
    assert (c.start, c.end) == (10.0, 11.0)
    assert link.moved == 40.0


def test_the_receiving_side_lands_a_chunk_no_sooner_than_its_last_byte_left():
    egress, ingress = Link(10.0), Link(10.0)
    sent = egress.send(0.0, 20.0)
    assert ingress.receive(sent).end == sent.end  # same speed: cut through, no extra time
    slow = Link(5.0)
    assert slow.receive(egress.send(2.0, 10.0)).end == 2.0 + 10.0 / 5.0
    # a second prefill's chunk, sent at the same time over its own egress, queues behind it
    other = Link(10.0).send(2.0, 10.0)
    assert slow.receive(other).end == 4.0 + 10.0 / 5.0


def test_a_landed_request_gets_its_first_token_at_the_next_step_boundary_without_compute():
    sim = _sim()
    sim.add_prebuilt("a", 16384, 4, 0.5)
    _drain(sim)
    a = sim.requests["a"]
    assert a.admitted_at == a.first_token_at == 0.5  # idle server: at once, no forward pass
    assert len(a.token_times) == 4 and a.finished_at == a.token_times[-1]
    assert sim.steps == 3  # three decode steps for the other three tokens; no prefill batch


def test_a_request_landing_mid_step_waits_for_the_step_to_end():
    sim = _sim()
    sim.add_prebuilt("a", 16384, 50, 0.0)
    sim.advance(0.0)  # a's first token, then its first decode step is in flight
    step_end = sim.pipeline.in_flight[0].done_at
    sim.add_prebuilt("b", 16384, 2, step_end / 2)
    while sim.requests["b"].first_token_at is None:
        sim.advance(sim.next_event_time())
    assert sim.requests["b"].first_token_at == step_end


def test_landed_requests_are_admitted_in_order_up_to_max_running():
    sim = _sim(max_running=1)
    sim.add_prebuilt("late", 100, 2, 0.11)
    sim.add_prebuilt("early", 100, 2, 0.1)
    _drain(sim)
    early, late = sim.requests["early"], sim.requests["late"]
    assert early.first_token_at == 0.1
    assert late.first_token_at == early.finished_at  # its slot was taken until then


def test_the_next_telling_time_covers_an_admission():
    sim = _sim()
    sim.add_prebuilt("a", 100, 3, 2.0)
    assert sim.next_telling_time() == 2.0


def test_each_prefilled_chunk_is_heard_with_its_batch_times():
    sim = _sim(tp=4, pp=8)
    heard = []
    sim.on_chunk = lambda req, n, started, done: heard.append((req.rid, n, started, done))
    sim.add("a", 20000, 1, 0.0)
    _drain(sim)
    assert [n for _, n, _, _ in heard] == [8192, 8192, 3616]
    assert all(started < done for _, _, started, done in heard)
    assert heard[-1][3] == sim.requests["a"].first_token_at == sim.requests["a"].finished_at
    assert [d for *_, d in heard] == sorted(d for *_, d in heard)


def test_stage_histogram_is_prometheus_text_with_sglangs_buckets():
    stages = StageLatencies()
    for seconds in (0.0005, 0.02, 0.02, 5000.0):
        stages.observe("decode_transferred", seconds)
    stages.observe("decode_bootstrap", 0.0)
    text = "\n".join(stages.lines('{model_name="m",engine_type="decode"}')) + "\n"
    (family,) = text_string_to_metric_families(text)
    assert family.name == "sglang:per_stage_req_latency_seconds" and family.type == "histogram"
    by = {(s.name, s.labels["stage"], s.labels.get("le")): s.value for s in family.samples}
    assert by[("sglang:per_stage_req_latency_seconds_count", "decode_transferred", None)] == 4
    assert by[("sglang:per_stage_req_latency_seconds_sum", "decode_transferred", None)] == (
        pytest.approx(5000.0405)
    )
    le = next(b for b in STAGE_BUCKETS if b >= 0.02)
    bucket = "sglang:per_stage_req_latency_seconds_bucket"
    assert by[(bucket, "decode_transferred", repr(float(le)))] == 3
    assert by[(bucket, "decode_transferred", "+Inf")] == 4  # beyond the last (~1191 s) bucket
    assert by[(bucket, "decode_bootstrap", "0.001")] == 1
    assert len(STAGE_BUCKETS) == 30 and STAGE_BUCKETS[-1] == pytest.approx(0.001 * 1.62**29)


@pytest.mark.parametrize(
    ("body", "field"),
    [({"bootstrap_room": 1}, "bootstrap_host"),
     ({"bootstrap_host": "h", "bootstrap_room": "1"}, "bootstrap_room"),
     ({"bootstrap_host": "h", "bootstrap_room": 1, "bootstrap_port": "x"}, "bootstrap_port")],
)  # fmt: skip
def test_a_request_without_its_pairing_is_refused_naming_the_field(body, field):
    with pytest.raises(BootstrapError, match=field):
        Bootstrap.of(body)


def test_sglangs_fake_bootstrap_host_moves_no_kv():
    assert Bootstrap.of({"bootstrap_host": "2.2.2.2", "bootstrap_room": 0}).fake
    real = Bootstrap.of({"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998,
                         "bootstrap_room": 2**62})  # fmt: skip
    assert not real.fake and real.port == 8998


def test_the_bootstrap_server_answers_sglangs_routes():
    info = {"prefill_attn_tp_size": 4, "prefill_dp_size": 1, "prefill_pp_size": 8,
            "prefill_page_size": 1}  # fmt: skip

    async def run() -> None:
        async with TestClient(TestServer(bootstrap_app(info, "127.0.0.9", 4321))) as client:
            health = await client.get("/health")
            assert health.status == 200 and await health.text() == "OK"
            sizes = await client.get("/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1")
            assert await sizes.json() == info
            rank = await client.get("/route?engine_rank=3&target_dp_group=0&target_pp_rank=7")
            assert await rank.json() == {"rank_ip": "127.0.0.9", "rank_port": 4321}
            missing = await client.get("/route?engine_rank=0")
            assert missing.status == 400
            assert (await client.post("/route")).status == 405
            beyond = await client.get("/route?engine_rank=4&target_dp_group=0&target_pp_rank=0")
            assert beyond.status == 404
            put = await client.put("/route", json={"role": "Prefill", "rank_port": 1})
            assert put.status == 200

    asyncio.run(run())
