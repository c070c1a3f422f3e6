"""A client's timings against the scripted server's truth, split by phase.

The truth is the server's alone (``pytest_kimi.testing.scripted``): its handler's entry
(``head``), its writes, and the kernel's arrival stamp of the request's first segment. The
client's stamps are on the same clock (CLOCK_MONOTONIC, system-wide on Linux). Per request,
client - truth is split where it arises, in order along the request's path:

======================  ====================================================  ============
phase                   from -> to                                            whose
======================  ====================================================  ============
``connect``             connecting began (the latency's start) -> open        client
``send``                open -> first segment in the server's kernel          client
``server``              in the server's kernel -> server's handler entry      server
``back``                server wrote the chunk -> client stamped it           client
======================  ====================================================  ============

``back`` is the chunk's trip over loopback (microseconds) plus the client's lateness in
reading and parsing it. The server's part, how late its own loop read the request, is
measured by the kernel's stamp, never by the client. A client time inside the window of the
server's write (just before the ``send`` call to just after it) counts as no error: a
preemption inside that call is the server's.

TTFT error = connect + send + server + back(first token); E2E error likewise with back(end);
TPOT error = (back(last token) - back(first token)) / (tokens - 1). The client's own share is
the error less ``server``. ``prepare`` (issued -> connecting began: building the request) is
the client's work before the clock starts: reported, not part of any error.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimi.results.metrics import per_request_ms
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests

# The reasoning case held by tests/integration/test_reasoning.py and measured by
# benchmarks/reasoning_accuracy.py: 100 thinking tokens, then 100 answer tokens
REASONING, TOTAL = 100, 200
TTFT_MS, ITL_MS = 150, 4

PHASES = ("connect", "send", "server", "back")


@dataclass(frozen=True)
class Split:
    """One request: client - truth in ms for TTFT, TPOT and E2E, and TTFT's and E2E's phases."""

    ttft: float
    tpot: float
    e2e: float
    prepare: float  # before the clock: not part of the error
    connect: float
    send: float
    server: float
    back_first: float
    back_end: float
    back_last: float

    @property
    def client_ttft(self) -> float:
        """The client's own share of the TTFT error (all but the server's lateness)."""
        return self.ttft - self.server

    @property
    def client_e2e(self) -> float:
        return self.e2e - self.server


def _written(chunk: Sequence[Any]) -> tuple[float, float]:
    """When the server wrote a chunk: (just before the write, just after it)."""
    return (chunk[2], chunk[0])


def _seen(client_time: float, window: tuple[float, float]) -> float:
    """The server's write instant as the client saw it: inside the write's window, no error."""
    return min(max(client_time, window[0]), window[1])


def arrived(entry: dict[str, Any]) -> float:
    """When the request's first segment reached the server: the kernel's stamp, or the
    server's read where there is none."""
    return entry.get("kernel_first") or entry["first_byte"]


def server_ms(entry: dict[str, Any]) -> float:
    """The server's share: how late its own loop read the request (arrival -> handler)."""
    return (entry["head"] - arrived(entry)) * 1000.0


def split(record: RequestRecord, entry: dict[str, Any]) -> Split:
    """Where ``record``'s error against ``entry`` (the server's truth) arose, in ms."""
    if record.first_token_time is None or record.end_time is None or not record.chunks:
        raise ValueError(f"request {record.index} has no stream to compare: {record.error}")
    start = record.latency_start
    chunks = entry["chunks"]
    first = _seen(record.first_token_time, _written(chunks[0]))
    last = _seen(record.chunks[-1].time, _written(chunks[-1]))
    end = _seen(record.end_time, (entry["end_before"], entry["end"]))
    tokens = sum(c[1] for c in chunks)
    issued = record.start_time if record.start_time is not None else start
    # inside the latency only: with clock_start "send" connecting precedes its start
    connecting = max(start, record.connect_time if record.connect_time is not None else start)
    connected = max(
        connecting, connecting if record.connected_time is None else record.connected_time
    )
    ms = 1000.0
    client_tpot = (record.chunks[-1].time - record.first_token_time) / (record.output_tokens - 1)
    true_tpot = (last - first) / (tokens - 1)
    return Split(
        ttft=((record.first_token_time - start) - (first - entry["head"])) * ms,
        tpot=(client_tpot - true_tpot) * ms,
        e2e=((record.end_time - start) - (end - entry["head"])) * ms,
        prepare=((record.connect_time or issued) - issued) * ms,
        connect=(connected - connecting) * ms,
        send=(arrived(entry) - connected) * ms,
        server=server_ms(entry),
        back_first=(record.first_token_time - first) * ms,
        back_end=(record.end_time - end) * ms,
        back_last=(record.chunks[-1].time - last) * ms,
    )


def match(records: Sequence[RequestRecord], truth: Sequence[dict[str, Any]]) -> list[Split]:
    """Every measured record against the truth entry the server keyed by its request id
    (``/generate``: ``meta_info.id`` is the entry's index; OpenAI APIs: ``cmpl-N`` or
    ``chatcmpl-N``)."""
    by_id = {}
    for entry in truth:
        for form in ("{}", "cmpl-{}", "chatcmpl-{}"):
            by_id[form.format(entry["index"])] = entry
    out = []
    for record in records:
        if record.warmup:
            continue
        if not record.success or record.request_id not in by_id:
            raise ValueError(f"request {record.index} failed or unknown to the server: "
                             f"{record.error or record.request_id}")  # fmt: skip
        out.append(split(record, by_id[record.request_id]))
    return out


@dataclass(frozen=True)
class ReasoningTiming:
    """One reasoning chat stream: the figures a user reads (``per_request_ms``) less the
    server's truth, in ms, and the server's own spans that tell right from wrong timing."""

    ttft: float  # client TTFT - (first write - the client's start): the chunk's trip back
    ttfat: float  # the same for the first answer token
    tpot: float  # client TPOT - the server's (first write -> [DONE] write) / (tokens - 1)
    there: float  # the request's trip: the client's start -> the server's handler entry
    thinking_ms: float  # the server's first answer write - its first write
    answer_ms: float  # the server's [DONE] write - its first answer write
    true_ttft: float
    true_tpot: float


def reasoning_timings(
    records: Sequence[RequestRecord], truth: Sequence[dict[str, Any]]
) -> list[ReasoningTiming]:
    """Every measured chat record against the server's entry ``chatcmpl-<index>``."""
    by_id = {f"chatcmpl-{e['index']}": e for e in truth}
    out = []
    for record in records:
        if record.warmup:
            continue
        client = per_request_ms([record])  # one record: no list falls out of line
        if not all(client[key] for key in ("ttft", "ttfat", "tpot")):
            raise ValueError(f"request {record.index} has no TTFT, TTFAT or TPOT to compare "
                             f"(failed, no answer, or one token): {record.error}")  # fmt: skip
        entry = by_id[record.request_id]
        chunks = entry["chunks"]
        first = chunks[0][2]  # stamped just before the write: the server had the token then
        answer = next(c[2] for c in chunks if c[3] == "answer")
        done = entry["end_before"]
        ms, start = 1000.0, record.latency_start
        true_tpot = (done - first) * ms / (entry["completion_tokens"] - 1)
        out.append(ReasoningTiming(
            ttft=client["ttft"][0] - (first - start) * ms,
            ttfat=client["ttfat"][0] - (answer - start) * ms,
            tpot=client["tpot"][0] - true_tpot,
            there=(entry["head"] - start) * ms,
            thinking_ms=(answer - first) * ms,
            answer_ms=(done - answer) * ms,
            true_ttft=(first - start) * ms,
            true_tpot=true_tpot,
        ))  # fmt: skip
    return out


def reasoning_server_argv(port: int) -> list[str]:
    """The scripted server streaming the reasoning case's chat chunks on ``port``."""
    return [sys.executable, "-m", "pytest_kimi.testing.scripted", "--host", "127.0.0.1",
            "--port", str(port), "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS),
            "--reasoning-tokens", str(REASONING), "--jitter", "0.5", "--seed", "3"]  # fmt: skip


def run_reasoning_chat(url: str, n: int, concurrency: int) -> list[RequestRecord]:
    """``n`` chat streams of the reasoning case (after one warm-up) through the product's
    client."""
    specs = [RequestSpec(f"p{i}", f"question {i} " * 16, 32) for i in range(n)]
    options = ClientOptions(api="chat", output_len=TOTAL, concurrency=concurrency)
    warmup = [RequestSpec("warm", "warm up " * 16, 32)]
    return asyncio.run(run_requests(url, specs, options, warmup=warmup))
