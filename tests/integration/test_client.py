"""The streaming client against a live mock server: records, token counts, failures kept."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import httpx

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
from pytest_kimi.workload.transport import MeasuringTransport

PROMPT = " ".join(["bago"] * 64)


def _run(url: str, n: int = 4, **kw) -> list:
    specs = [RequestSpec(f"p{i}", PROMPT, 64) for i in range(n)]
    options = ClientOptions(output_len=kw.pop("output_len", 6), concurrency=2, **kw)
    warm = [RequestSpec("w", PROMPT, 64)]
    return asyncio.run(run_requests(url, specs, options, warmup=warm))


def test_generate_records_every_chunk_and_server_counts(mock_server):
    records = _run(mock_server)
    warm, measured = records[0], records[1:]
    assert warm.warmup and warm.index == -1
    assert [r.index for r in measured] == [0, 1, 2, 3]
    for r in measured:
        assert r.success and r.status == 200 and r.error == ""
        assert r.prompt_tokens == 64 and r.completion_tokens == 6
        assert sum(c.tokens for c in r.chunks) == 6
        assert r.send_time < r.first_token_time == r.chunks[0].time <= r.end_time
        times = [c.time for c in r.chunks]
        assert times == sorted(times)


def test_openai_apis_count_tokens_from_usage(mock_server):
    for api in ("completions", "chat"):
        records = _run(mock_server, n=2, api=api)
        for r in records:
            assert r.success, r.error
            assert r.completion_tokens == 6 and r.prompt_tokens == 64
            assert len(r.chunks) == 6


def test_pooled_and_fresh_connections_give_the_same_counts(mock_server):
    fresh = _run(mock_server, n=2, pooled=False)
    pooled = _run(mock_server, n=2, pooled=True)
    assert [r.completion_tokens for r in fresh] == [r.completion_tokens for r in pooled]


def test_http_error_is_recorded_not_raised(mock_server):
    records = _run(mock_server + "/nope", n=2)
    assert all(not r.success for r in records)
    assert all(r.status == 404 and r.error.startswith("HTTP 404") for r in records)
    assert all(r.end_time is not None for r in records)


def test_connection_refused_is_recorded():
    records = _run(f"http://127.0.0.1:{free_port()}", n=2)
    assert all(not r.success and "ConnectError" in r.error for r in records)


def test_request_that_takes_too_long_is_a_timeout_failure(mock_server):
    records = _run(mock_server, n=1, output_len=100000, timeout_s=0.3)
    assert records[-1].success is False
    assert records[-1].error.startswith("timeout")
    assert records[-1].chunks  # what arrived before the timeout is kept


def test_a_server_that_resets_while_the_request_is_sent_fails_that_request_only():
    # it accepts, reads the first bytes of the request and resets (SO_LINGER 0): the rest of
    # a 32 MB body, more than the kernel's buffers hold, meets the reset mid-send; the run
    # goes on and records the failure
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    stop = threading.Event()

    def reset_all() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(65536)  # the client is sending
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=reset_all, daemon=True)
    thread.start()
    try:
        specs = [RequestSpec(f"p{i}", "x " * 16_000_000, 16_000_000) for i in range(2)]
        records = asyncio.run(run_requests(f"http://127.0.0.1:{port}", specs,
                                           ClientOptions(output_len=4, concurrency=2)))  # fmt: skip
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
    assert len(records) == 2 and not any(r.success for r in records)
    assert all(r.error.startswith("WriteError: sending the request") for r in records), [
        r.error for r in records
    ]


def test_an_address_that_does_not_answer_is_passed_over_for_the_next(mock_server):
    # a name that resolves to several addresses (localhost: ::1 and 127.0.0.1) is tried in
    # order; the first that connects serves every later request
    port = int(mock_server.rsplit(":", 1)[1])
    transport = MeasuringTransport()
    dead = (socket.AF_INET, ("127.0.0.1", free_port()))
    live = (socket.AF_INET, ("127.0.0.1", port))
    transport._addresses[("kimi-test-host", port)] = [dead, live]

    async def get() -> int:
        async with httpx.AsyncClient(transport=transport) as http:
            return (await http.get(f"http://kimi-test-host:{port}/health")).status_code

    assert asyncio.run(get()) == 200
    assert transport._addresses[("kimi-test-host", port)] == [live, dead]
