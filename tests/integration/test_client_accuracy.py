"""The client's timings against a server that records what it really did, by phase.

The truth is the scripted server's alone: it runs each request's script from its handler's
entry (the request's head parsed, before its body is read), stamps every write, and has the
kernel stamp each request's first segment on arrival (``pytest_kimi.testing.scripted``). The
client sends nothing a real client would not. All stamps are CLOCK_MONOTONIC, one clock for
both processes, so client - truth splits by phase (``pytest_kimi.testing.truth``): connecting,
sending, the server's own lateness in reading the request (the server's share, never the
client's), and the chunk's way back into the client's records.

Prompts are the mission's size (16K tokens, ~64 KB on the wire) on each of the three APIs.

The client's thread runs at real-time priority while it is measured, where the kernel allows it
(root or CAP_SYS_NICE, as in CI): on a loaded machine the scheduler would otherwise leave it
waiting on a run queue between two of its clock reads, which is the OS's time, not the client's.
Measured on this 2-core machine with both cores taken by busy loops: without it 21% of the
requests' own share was over 2 ms (connecting -> connected, up to 6 ms); with it the own share
was 0.11-0.13 ms on average and 0.24 ms at most, on every API, at 8 and 64 streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.testing.truth import match
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests

PROMPT_TOKENS = 16_000
TOLERANCE_MS = 2.0  # per request, the client's own share of the TTFT and E2E error
# what real-time priority cannot stop: the hypervisor taking the virtual CPU (steal), or no
# priority where the kernel refuses it. This share of requests may meet that, up to the limit;
# the rest are held to the tolerance and their mean to the goals (0.5 ms at 8
# streams, 1 ms at 64).
SPIKE_BUDGET = 0.15
SPIKE_LIMIT_MS = 30.0
MEAN_LIMIT_MS = {8: 0.5, 64: 1.0}
TPOT_MEAN_LIMIT_MS = 0.05
CAUSALITY_SLACK_MS = 0.01  # float rounding of perf_counter differences


@contextlib.contextmanager
def _the_cpu_on_wake() -> Iterator[bool]:
    """Run this thread SCHED_FIFO while inside, where permitted: the kernel then runs it the
    moment it wakes, ahead of every ordinary process. Yields whether it was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # 0: this thread
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _serve(spawn, itl_ms: float) -> str:
    port = free_port()
    server = spawn(
        [sys.executable, "-m", "pytest_kimi.testing.scripted", "--port", str(port),
         "--ttft-ms", "100", "--itl-ms", str(itl_ms), "--jitter", "1.0", "--seed", "7"],
        "scripted",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    server.wait_http(url + "/health")
    return url


@pytest.mark.parametrize(
    ("api", "concurrency", "itl_ms"),
    [("generate", 8, 40.0), ("completions", 8, 40.0), ("chat", 8, 40.0), ("generate", 64, 40.0)],
)
def test_client_matches_the_servers_own_truth_phase_by_phase(spawn, api, concurrency, itl_ms):
    url = _serve(spawn, itl_ms)
    n = concurrency * 3
    specs = [RequestSpec(f"p{i}", f"r{i} " + "tok " * PROMPT_TOKENS, PROMPT_TOKENS)
             for i in range(n)]  # fmt: skip
    options = ClientOptions(api=api, output_len=32, concurrency=concurrency)
    warmup = [RequestSpec("warm", "w " * 32, 32)]
    with _the_cpu_on_wake():
        records = asyncio.run(run_requests(url, specs, options, warmup=warmup))
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # given back
    truth = httpx.get(url + "/truth").json()
    assert len(truth) == n + 1 and all(r.success for r in records), records[0].error
    splits = match(records, truth)
    assert all(e["kernel_first"] is not None for e in truth)  # the server's lateness is known
    table = {k: np.array([getattr(s, k) for s in splits]) for k in (
        "ttft", "e2e", "tpot", "connect", "send", "server", "back_first", "back_end",
        "client_ttft", "client_e2e")}  # fmt: skip
    report = "; ".join(
        f"{k} mean {v.mean():.3f} p50 {np.median(v):.3f} max {v.max():.3f}"
        for k, v in table.items()
    )
    # causality on one clock: no client stamp before the server event it follows
    for phase in ("send", "server", "back_first", "back_end"):
        assert table[phase].min() >= -CAUSALITY_SLACK_MS, (phase, report)
    # the client's own share, request by request
    own = np.abs(np.stack([table["client_ttft"], table["client_e2e"]], axis=1))
    spikes = (own > TOLERANCE_MS).any(axis=1)
    assert spikes.mean() <= SPIKE_BUDGET and own.max() <= SPIKE_LIMIT_MS, report
    assert own[~spikes].mean(axis=0).max() < MEAN_LIMIT_MS[concurrency], report
    assert np.abs(table["tpot"]).mean() < TPOT_MEAN_LIMIT_MS, report
    # token counts are the server's
    assert all(r.output_tokens == 32 for r in records)
    if api != "chat":  # chat's usage counts the prompt's words too
        assert all(r.input_tokens == PROMPT_TOKENS + 1 for r in records if not r.warmup)


@pytest.mark.parametrize("pooled", [False, True])
def test_connection_policy(spawn, pooled):
    """Fresh: one TCP connection per request (bench_serving's way, our default); pooled:
    keep-alive reuse, which through the SGLang Router adds tens of ms to TTFT (see client.py)."""
    port = free_port()
    server = spawn(
        [sys.executable, "-m", "pytest_kimi.testing.scripted", "--port", str(port),
         "--ttft-ms", "5", "--itl-ms", "1"],
        "scripted",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    server.wait_http(url + "/health")
    specs = [RequestSpec(f"p{i}", "w " * 8, 8) for i in range(12)]
    records = asyncio.run(run_requests(url, specs, ClientOptions(output_len=4, concurrency=2,
                                                                pooled=pooled)))  # fmt: skip
    assert all(r.success for r in records)
    ports = [tuple(e["peer"]) for e in httpx.get(url + "/truth").json()]
    assert len(ports) == 12
    if pooled:
        assert len(set(ports)) <= 2  # two concurrent connections, reused
    else:
        assert len(set(ports)) == 12


def test_a_busy_client_loop_does_not_move_the_times_it_records(spawn):
    # the client's own event loop is blocked 8 ms of every 10: chunks wait in the kernel,
    # and the client still records when they arrived (the kernel's stamps), not when it read
    # them. The gap between a stream's chunks (20 ms) is longer than a block: a chunk read
    # after its stream's next one arrived would carry the next one's stamp (docs/metrics.md)
    url = _serve(spawn, 20.0)
    specs = [RequestSpec(f"p{i}", f"r{i} " + "tok " * 64, 64) for i in range(16)]
    options = ClientOptions(api="generate", output_len=8, concurrency=4)

    async def busy_run() -> list:
        done = asyncio.Event()

        async def hog() -> None:
            while not done.is_set():
                time.sleep(0.008)  # blocks the loop: the point
                await asyncio.sleep(0.002)

        hogging = asyncio.create_task(hog())
        try:
            return await run_requests(url, specs, options)
        finally:
            done.set()
            await hogging

    records = asyncio.run(busy_run())
    splits = match(records, httpx.get(url + "/truth").json())
    # the first chunk and [DONE] have no later chunk of theirs to be merged with (the last
    # token's chunk may: the server may be preempted between it and [DONE])
    back = np.array([[s.back_first, s.back_end] for s in splits])
    assert back.min() >= -CAUSALITY_SLACK_MS
    # a read-time stamp would be up to 8 ms late on most requests (the loop is blocked 8 ms
    # of every 10); some may be late from the server's side alone, preempted between stamping
    # an event and sending it (148 ms once, 5 of 16 requests once, on a loaded 2-core machine)
    late = (back >= 1.0).any(axis=1)
    assert late.mean() < 0.5 and np.median(back) < 0.5, back
