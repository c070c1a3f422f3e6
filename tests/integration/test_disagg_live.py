"""The mock's prefill/decode disaggregation live: a prefill server, a decode server and the real
SGLang Router in PD mode (``--pd-disaggregation``) on loopback. What the client sees comes
from the decode side; each side counts and times what SGLang's would, on ``/metrics``."""

from __future__ import annotations

import asyncio
import itertools
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_kimi.deploy.ports import free_ports
from pytest_kimi.testing.processes import mock_argv
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests

TIME_SCALE = 200.0


def _metrics(url: str) -> dict[tuple[str, str], float]:
    """(sample name, stage or "") -> value, summed over the other labels."""
    out: dict[tuple[str, str], float] = {}
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "le" in s.labels:
                continue
            key = (s.name, s.labels.get("stage", ""))
            out[key] = out.get(key, 0.0) + s.value
    return out


def _pd(
    spawn, *decode_flags: str, time_scale: float = TIME_SCALE, version: str = "0.5.23"
) -> tuple[str, str, str]:
    """A 1-node TP8 prefill, a 1-node TP8 decode and the router; their URLs. 0.5.9 is told
    the decode side's TP (--disaggregation-decode-tp); later releases take no such flag: the
    prefill learns it from the decode side."""
    prefill_port, decode_port, bootstrap, router_port, metrics_port = free_ports(5)
    common = ("--tp-size", "8", "--enable-metrics", "--mock-time-scale", str(time_scale),
              "--mock-sglang-version", version)  # fmt: skip
    shape = ("--disaggregation-decode-tp", "8") if version == "0.5.9" else ()
    prefill = spawn(mock_argv(prefill_port, *common, "--disaggregation-mode", "prefill",
                              "--disaggregation-bootstrap-port", str(bootstrap), *shape),
                    "prefill")  # fmt: skip
    decode = spawn(mock_argv(decode_port, *common, "--disaggregation-mode", "decode",
                             *decode_flags), "decode")  # fmt: skip
    p_url, d_url = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    prefill.wait_http(p_url + "/health")
    decode.wait_http(d_url + "/health")
    router = spawn([sys.executable, "-m", "smg.launch_router", "--pd-disaggregation",
                    "--prefill", p_url, str(bootstrap), "--decode", d_url,
                    "--prefill-policy", "round_robin", "--decode-policy", "round_robin",
                    "--host", "127.0.0.1", "--port", str(router_port),
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                    "--disable-retries"], "router")  # fmt: skip
    r_url = f"http://127.0.0.1:{router_port}"
    router.wait_http(r_url + "/readiness", timeout_s=60)
    return p_url, d_url, r_url


def _run(url: str, n: int, prompt_words: int, output_len: int, concurrency: int) -> list:
    specs = [RequestSpec(f"p{i}", f"r{i} " + "tok " * prompt_words, prompt_words)
             for i in range(n)]  # fmt: skip
    options = ClientOptions(api="generate", output_len=output_len, concurrency=concurrency)
    return asyncio.run(run_requests(url, specs, options))


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_requests_through_the_router_are_prefilled_on_one_side_and_decoded_on_the_other(
    spawn, version
):
    p_url, d_url, r_url = _pd(spawn, version=version)
    ready = httpx.get(r_url + "/readiness", timeout=10).json()
    assert ready["status"] == "ready"
    records = _run(r_url, n=4, prompt_words=16383, output_len=8, concurrency=2)
    assert all(r.success for r in records), [r.error for r in records]
    assert all(r.output_tokens == 8 for r in records)  # the decode's count, with the first token
    prefill, decode = _metrics(p_url), _metrics(d_url)
    # the prefill makes one token a request; the decode makes the rest and counts all of them
    assert prefill[("sglang:num_requests_total", "")] == 4
    assert prefill[("sglang:generation_tokens_total", "")] == 4
    assert decode[("sglang:num_requests_total", "")] == 4
    assert decode[("sglang:generation_tokens_total", "")] == 4 * 8
    assert decode[("sglang:prompt_tokens_total", "")] == prefill[("sglang:prompt_tokens_total", "")]
    stage = "sglang:per_stage_req_latency_seconds"
    for name in ("prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache"):
        assert prefill[(f"{stage}_count", name)] == 4, name
    if version == "0.5.9":
        assert prefill[(f"{stage}_count", "prefill_prepare")] == 4
        assert prefill[(f"{stage}_count", "prefill_waiting")] == 4 * 2  # a chunk: two 8K each
    else:  # only traced from 0.5.10; the queue in queue_time, earlier chunks in chunked_prefill
        assert ("sglang:per_stage_req_latency_seconds_count", "prefill_waiting") not in prefill
        assert ("sglang:per_stage_req_latency_seconds_count", "prefill_prepare") not in prefill
        assert prefill[(f"{stage}_count", "chunked_prefill")] == 4  # the first of two chunks
        assert prefill[("sglang:queue_time_seconds_count", "")] == 4
    for name in ("decode_prepare", "decode_bootstrap", "decode_transferred", "decode_waiting"):
        assert decode[(f"{stage}_count", name)] == 4, name
    # a 16K prompt's KV to 8 decode ranks over one node's 12.5 GB/s: 0.74 s, of which the
    # first chunk's half went while the second was prefilled (1.7 s): 0.37 s exposed
    exposed = prefill[(f"{stage}_sum", "prefill_transfer_kv_cache")] / 4
    assert exposed == pytest.approx(8192 * 1152 * 61 * 8 / 12.5e9, rel=1e-6)
    assert decode[(f"{stage}_sum", "decode_transferred")] / 4 > exposed
    for gauge in ("num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs"):
        assert decode[(f"sglang:{gauge}", "")] == 0  # nothing left waiting
    if version == "0.5.9":
        assert prefill[("sglang:kv_transfer_speed_gb_s", "")] == 0  # as 0.5.9: never set
    else:  # one observation a transfer: its size (the whole prompt's KV for 8 ranks), time
        kv = "sglang:kv_transfer_"
        assert prefill[(f"{kv}latency_ms_count", "")] == prefill[(f"{kv}total_mb_count", "")] == 4
        assert prefill[(f"{kv}total_mb_sum", "")] / 4 == pytest.approx(
            16384 * 1152 * 61 * 8 / 2**20, rel=0.01)  # the prompt and its template's tokens
        assert prefill[(f"{kv}latency_ms_sum", "")] / 4 == pytest.approx(exposed * 1000)
        speed = prefill[(f"{kv}speed_gb_s_sum", "")] / 4
        assert speed == pytest.approx(prefill[(f"{kv}total_mb_sum", "")] / 4 / 1024 / exposed)
    # TTFT holds prefill and the exposed transfer: longer than the prefill's own forward
    forward = prefill[(f"{stage}_sum", "prefill_forward")] / 4
    ttfts = sorted((r.first_token_time - r.latency_start) * TIME_SCALE for r in records)
    assert ttfts[0] > forward + exposed


def test_a_full_decode_side_holds_prefills_back(spawn):
    # slower than the other tests: a prefill of 8K tokens is ~1.7 s of cluster time, 34 ms of
    # wall time here, the least gap this test's wall-clock stamps must tell apart
    p_url, d_url, r_url = _pd(spawn, "--max-running-requests", "1", time_scale=50.0)
    records = _run(r_url, n=3, prompt_words=8000, output_len=40, concurrency=3)
    assert all(r.success for r in records), [r.error for r in records]
    # one decode slot: each request's prefill waits for the previous request's last token
    by_first = sorted(records, key=lambda r: r.first_token_time)
    for before, after in itertools.pairwise(by_first):
        assert after.first_token_time > before.end_time
    prefill, decode = _metrics(p_url), _metrics(d_url)
    stage = "sglang:per_stage_req_latency_seconds"
    waited = prefill[(f"{stage}_sum", "prefill_bootstrap")]
    decoding = sum((r.end_time - r.first_token_time) * 50.0 for r in records)
    assert waited > decoding / 3  # two of three waited about one decode each
    # the decode side saw the same wait for its slot (from its own arrival: not the same mark)
    assert decode[(f"{stage}_count", "decode_bootstrap")] == 3
    assert decode[(f"{stage}_sum", "decode_bootstrap")] > decoding / 3


def test_the_warm_up_fields_move_no_kv_and_a_request_without_a_room_is_refused(spawn):
    p_url, d_url, _ = _pd(spawn)
    fake = {"text": "hello " * 10, "sampling_params": {"max_new_tokens": 4},
            "bootstrap_host": "2.2.2.2", "bootstrap_room": 0}  # fmt: skip
    for url, tokens in ((p_url, 1), (d_url, 4)):  # each side alone: no pairing needed
        answer = httpx.post(url + "/generate", json=fake, timeout=30).json()
        assert answer["meta_info"]["completion_tokens"] == tokens
    bare = httpx.post(d_url + "/generate", json={"text": "hi", "sampling_params": {}}, timeout=30)
    assert bare.status_code == 400 and "bootstrap_host" in bare.json()["message"]
    stage = "sglang:per_stage_req_latency_seconds_count"
    assert (stage, "decode_transferred") not in _metrics(d_url)  # nothing was transferred
