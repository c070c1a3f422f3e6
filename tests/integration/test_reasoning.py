"""Reasoning streams: TTFT, TPOT and token counts against a server's own clock.

A reasoning model behind SGLang (0.5.9, ``--reasoning-parser``) streams its thinking as
``delta.reasoning_content`` and then the answer as ``delta.content``. A client that times only
``content`` reports the end of the thinking as TTFT. Here the scripted server streams exactly
SGLang's chunks and keeps its own record of what it did, on its own clock.

What "the server's truth" means here. The server runs each request's script from the instant
the request reached its handler (its head parsed), never from anything the client says, and
stamps every write with ``time.perf_counter``: when it wrote
the first token, the first answer token, ``[DONE]``. ``perf_counter`` is CLOCK_MONOTONIC,
system-wide on Linux, so those instants and the client's are on one clock. The client's TTFT
runs from the request's start (issued, before connecting: bench_serving's) to the first
chunk's arrival; the truth it must match is from the same start to the server's first write:
TTFT_true = first write - start (TTFAT likewise), TPOT_true =
(``[DONE]`` write - first write) / (output tokens - 1), bench_serving's definition. What is
left, client - truth, is the client's own error: the chunk's trip back over loopback plus the
client's parsing and event loop. It can never be negative (a chunk seen before it was written
would be a bug this catches). Its size (within 1 ms for TTFT and TTFAT and 0.05 ms for TPOT on
a quiet machine, a few ms when other jobs hold the 2 cores) is a figure that
``benchmarks/reasoning_accuracy.py`` reports; the test holds each figure to its definition: nearer
the server's instant it names than the nearest wrong instant (hundreds of ms away for TTFT and
TTFAT; for TPOT, E2E / n lies ~0.7 ms above (last - first) / (n - 1) here).

The server's own TTFT (first write - its arrival) is shorter by the request's trip to the
server: loopback plus the server's accept and read. That part is real latency a user waits
for, which a server-side metric (SGLang's ``time_to_first_token_seconds``) cannot see; the test
checks that it is > 0.

/generate and /v1/completions: SGLang 0.5.9 has no reasoning field there (no reasoning in
``meta_info``, no ``reasoning_content`` in completion chunks; its ``/separate_reasoning`` route
only splits a finished text), so thinking arrives as ordinary text and TTFT already counts it;
their records say 0 reasoning tokens.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.results.metrics import summarize
from pytest_kimi.testing.truth import (
    ITL_MS,
    REASONING,
    TOTAL,
    TTFT_MS,
    reasoning_server_argv,
    reasoning_timings,
    run_reasoning_chat,
)
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
from pytest_kimi.workload.stream import StreamParser

CAUSALITY_SLACK_MS = 0.01  # float rounding of perf_counter differences


def test_reasoning_chat_stream_matches_the_servers_own_clock(spawn):
    """Right against wrong, never against a stopwatch: each figure must sit nearer the
    server's instant it measures than the nearest wrong one, and never
    before it. How near (1 ms, 0.05 ms on a quiet machine) is benchmarks/reasoning_accuracy.py's
    figure, not a test: a busy machine makes a client late, not wrong."""
    port = free_port()
    server = spawn(reasoning_server_argv(port), "scripted")
    url = f"http://127.0.0.1:{port}"
    server.wait_http(url + "/health")
    records = run_reasoning_chat(url, n=24, concurrency=4)
    truth = httpx.get(url + "/truth").json()
    measured = [r for r in records if not r.warmup]
    assert len(truth) == len(records) and all(r.success for r in records), records[0].error
    by_id = {f"chatcmpl-{e['index']}": e for e in truth}
    for record in measured:  # token counts: exact, from the server's usage and its chunks
        entry = by_id[record.request_id]
        assert entry["anchor"] == entry["head"]  # the server kept its own clock
        assert record.output_tokens == entry["completion_tokens"] == TOTAL
        assert record.reasoning_tokens == entry["reasoning_tokens"] == REASONING
        assert record.answer_tokens == TOTAL - REASONING
    timings = reasoning_timings(records, truth)
    report = "\n".join(str(t) for t in timings)
    for t in timings:
        # on one clock a chunk is never seen before it was written, nor the request's
        # handler entered before the client started it
        assert min(t.ttft, t.ttfat) >= -CAUSALITY_SLACK_MS and t.there > 0, report
        # TTFT is the first thinking token, not the first answer token (thinking_ms later)
        assert t.ttft < t.thinking_ms / 2, report
        # TTFAT is the first answer token, not [DONE] (answer_ms later)
        assert t.ttfat < t.answer_ms / 2, report
        # TPOT is (last - first token) / (tokens - 1); the nearest wrong one, E2E / tokens,
        # is (TTFT - TPOT) / tokens higher (~0.7 ms here)
        assert abs(t.tpot) < (t.true_ttft - t.true_tpot) / TOTAL / 2, report
    # what the issue saw: timing only delta.content puts TTFT at the end of the thinking
    summary = summarize(measured)
    assert summary.ttfat_ms.min - summary.ttft_ms.max > REASONING * ITL_MS - TTFT_MS * 1.5
    assert summary.total_reasoning_tokens == REASONING * len(measured)
    assert summary.total_answer_tokens == (TOTAL - REASONING) * len(measured)


def test_mock_reasoning_flag_streams_sglang_reasoning_chunks(spawn, mock_cmd):
    port = free_port()
    proc = spawn(mock_cmd(port, "--mock-time-scale", "1000", "--mock-reasoning-tokens", "5",
                          "--mock-sglang-version", "0.5.9"), "mock")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
        lines = [x[5:].strip() for x in response.iter_lines() if x.startswith("data:")]
    chunks = [orjson.loads(x) for x in lines[:-1]]
    assert lines[-1] == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    # SGLang 0.5.9: DeltaMessage dumped whole (role/content/reasoning_content/tool_calls)
    assert deltas[0] == {"role": "assistant", "content": "", "reasoning_content": None,
                         "tool_calls": None}  # fmt: skip
    thinking = [d for d in deltas if d.get("reasoning_content")]
    assert len(thinking) == 5
    assert all(set(d) == {"role", "content", "reasoning_content", "tool_calls"} for d in thinking)
    assert all(d["content"] is None and d["role"] is None for d in thinking)
    answers = [d for d in deltas if d.get("content")]
    assert len(answers) == 3 and deltas.index(answers[0]) > deltas.index(thinking[-1])
    # the client on the same mock: reasoning counted, answer timed after it
    specs = [RequestSpec(f"p{i}", "hello there " * 8, 16) for i in range(3)]
    options = ClientOptions(api="chat", output_len=8, concurrency=3)
    records = asyncio.run(run_requests(url, specs, options))
    for record in records:
        assert record.success, record.error
        assert (record.output_tokens, record.reasoning_tokens, record.answer_tokens) == (8, 5, 3)
        assert record.first_token_time == record.chunks[0].time
        assert record.first_answer_time == record.chunks[5].time


def _feed_all(api: str, events: list[dict]) -> tuple[StreamParser, list[tuple[int, bool]]]:
    parser = StreamParser(api)
    return parser, [parser.feed(e) for e in events]


def _chat(delta: dict | None, usage: dict | None = None) -> dict:
    full = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
    choices = [] if delta is None else [{"index": 0, "delta": {**full, **delta}}]
    return {"id": "chatcmpl-1", "choices": choices, "usage": usage}


def test_continuous_usage_gives_exact_tokens_per_reasoning_chunk():
    # stream_interval 2 with continuous_usage_stats: usage is cumulative in every chunk
    def usage(done: int) -> dict:
        return {"prompt_tokens": 7, "completion_tokens": done, "reasoning_tokens": 0}

    events = [
        _chat({"role": "assistant", "content": ""}),
        _chat({"reasoning_content": " a b"}, usage(2)),
        _chat({"reasoning_content": " c"}, usage(3)),
        _chat({"content": " d e"}, usage(6)),  # the silent end-of-thinking token counts here
        _chat({}, None),
        _chat(None, usage(6)),
    ]
    parser, fed = _feed_all("chat", events)
    assert fed == [(0, False), (2, False), (1, False), (3, True), (0, False), (0, False)]
    assert (parser.completion_tokens, parser.reasoning_tokens, parser.prompt_tokens) == (6, 3, 7)


def test_reported_reasoning_tokens_win_over_counted_chunks():
    events = [_chat({"reasoning_content": "x"}), _chat({"content": "y"}),
              _chat(None, {"completion_tokens": 9, "completion_tokens_details":
                           {"reasoning_tokens": 6}})]  # fmt: skip
    parser, fed = _feed_all("chat", events)
    assert fed == [(1, False), (1, True), (0, False)]
    assert (parser.completion_tokens, parser.reasoning_tokens) == (9, 6)


def test_generate_and_completions_have_no_reasoning_field_so_all_text_is_answer():
    gen = [
        {"text": "<think> a", "meta_info": {"id": "1", "completion_tokens": 2}},
        {"text": "<think> a</think> b", "meta_info": {"id": "1", "completion_tokens": 4}},
    ]
    parser, fed = _feed_all("generate", gen)
    assert fed == [(2, True), (2, True)] and parser.reasoning_tokens == 0
    comp = [{"id": "c", "choices": [{"index": 0, "text": "<think>"}], "usage": None},
            {"id": "c", "choices": [], "usage": {"completion_tokens": 5}}]  # fmt: skip
    parser, fed = _feed_all("completions", comp)
    assert fed == [(1, True), (0, False)] and parser.reasoning_tokens == 0
