"""The mock's fault knobs, seen through the product's client: each failure is recorded."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests


def _start(spawn, mock_cmd, *faults: str):
    port = free_port()
    flags = [f"--mock-fault={f}" for f in faults]
    proc = spawn(mock_cmd(port, "--mock-time-scale", "1000", *flags), "mock")
    url = f"http://127.0.0.1:{port}"
    return proc, url


def _send(url: str, n: int = 1, **kw) -> list:
    specs = [RequestSpec(f"p{i}", "w " * 16, 16) for i in range(n)]
    options = ClientOptions(output_len=kw.pop("output_len", 8), concurrency=1, **kw)
    return asyncio.run(run_requests(url, specs, options))


def test_crash_after_n_requests_kills_the_process_and_fails_the_rest(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd, "crash_after=1")
    proc.wait_http(url + "/health")
    first, second = _send(url, n=2)
    assert first.success
    assert not second.success and second.error
    assert proc.popen.wait(timeout=10) == 1
    assert "EngineDeadError" in proc.text()


def test_cut_stream_is_a_failure_that_keeps_what_arrived(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd, "cut_after_tokens=3")
    proc.wait_http(url + "/health")
    [record] = _send(url)
    assert not record.success
    assert "without [DONE]" in record.error or "closed" in record.error
    assert sum(c.tokens for c in record.chunks) == 3


def test_malformed_sse_is_a_failure_with_its_reason(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd, "malformed_after_tokens=2")
    proc.wait_http(url + "/health")
    [record] = _send(url)
    assert not record.success and record.error.startswith("malformed SSE data")
    assert len(record.chunks) == 2


def test_error_rate_gives_http_500_records(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd, "error_rate=1")
    proc.wait_http(url + "/health")
    records = _send(url, n=3)
    assert all(r.status == 500 and r.error.startswith("HTTP 500") for r in records)


def test_stall_at_run_time_makes_requests_time_out_and_unstall_recovers(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd)
    proc.wait_http(url + "/health")
    assert httpx.post(url + "/kimi/faults", json={"stall": True}).json()["stall"] is True
    [stuck] = _send(url, timeout_s=0.5)
    assert not stuck.success and stuck.error.startswith("timeout")
    httpx.post(url + "/kimi/faults", json={"stall": False}).raise_for_status()
    [ok] = _send(url)
    assert ok.success


def test_health_knobs_and_log_lines(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd, "health=fail")
    proc.wait_http(url + "/get_model_info")
    assert httpx.get(url + "/health").status_code == 503
    httpx.post(url + "/kimi/faults", json={"health": "slow:5"}).raise_for_status()
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(url + "/health", timeout=0.3)
    for name, needle in [("oom", "CUDA out of memory"), ("nccl", "NCCL error"),
                         ("traceback", "Traceback (most recent call last)"),
                         ("engine_dead", "EngineDeadError")]:  # fmt: skip
        httpx.post(url + "/kimi/faults", json={"log": name}).raise_for_status()
        assert needle in proc.text()


def test_held_requests_wait_until_a_busy_health_probe_was_answered_late(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd, "health=busy_slow:2", "hold_until_late_health=true")
    proc.wait_http(url + "/health")  # idle: /health answers at once
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_send, url)
        while True:  # probe until one meets the request in flight (it cannot finish before)
            try:
                httpx.get(url + "/health", timeout=0.5).raise_for_status()
            except httpx.ReadTimeout:
                break
            assert not pending.done(), pending.result()
        [record] = pending.result(timeout=60)  # released once that probe was answered, late
    assert record.success
    assert "/health answered 2s late while busy" in proc.text()
    assert "releasing 1 held request(s)" in proc.text()  # it was still held at that moment
    # all or nothing: health=ok would leave held requests waiting for a late probe forever
    response = httpx.post(url + "/kimi/faults", json={"health": "ok"})
    assert response.status_code == 400 and "hold_until_late_health needs" in response.text
    both = {"health": "ok", "hold_until_late_health": False}
    state = httpx.post(url + "/kimi/faults", json=both).json()
    assert state["health"] == "ok" and state["hold_until_late_health"] is False


def test_unknown_fault_is_rejected(spawn, mock_cmd):
    proc, url = _start(spawn, mock_cmd)
    proc.wait_http(url + "/health")
    response = httpx.post(url + "/kimi/faults", json={"explode": 1})
    assert response.status_code == 400 and "unknown fault 'explode'" in response.text
    bad, _ = _start(spawn, mock_cmd, "error_rate=2")
    assert bad.popen.wait(timeout=20) == 2
    assert "error_rate: bad value" in bad.text()
    held, _ = _start(spawn, mock_cmd, "hold_until_late_health=true")
    assert held.popen.wait(timeout=20) == 2
    assert "hold_until_late_health needs health=slow:S or busy_slow:S" in held.text()
