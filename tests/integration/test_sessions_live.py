"""Sessions against the scripted server's own record of what it received and when.

The server hashes each request's prompt as it reads it (the chat API's message contents, or
/generate's text) and stamps its arrival and its last write on its own clock; its answers
are its own (" tok" per token). So a turn can be checked to carry the answers the server
actually returned, and a session's turns and think times to follow each other, by a truth
the client cannot touch.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import sys

import httpx
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.testing.truth import arrived
from pytest_kimi.workload import sessionsend
from pytest_kimi.workload.client import ClientOptions, run_requests
from pytest_kimi.workload.sessions import Session, ThinkTime, raw_text
from pytest_kimi.workload.specs import arrival_gaps

pytest_plugins = ["pytester"]

OUTPUT = 4
ANSWER = " tok" * OUTPUT  # what the scripted server streams for 4 tokens


def _scripted(spawn) -> str:
    port = free_port()
    server = spawn([sys.executable, "-m", "pytest_kimi.testing.scripted", "--port", str(port),
                    "--ttft-ms", "5", "--itl-ms", "1"], "scripted")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    server.wait_http(url + "/health")
    return url


def _sessions(n: int, turns: int) -> list[Session]:
    return [Session(f"s{i}", tuple(f"turn {k} of session {i}" for k in range(turns)),
                    system=f"system words {i}") for i in range(n)]  # fmt: skip


def _run(url: str, sessions: list[Session], **options) -> tuple[list, dict]:
    settings = ClientOptions(output_len=OUTPUT, **options)
    records = asyncio.run(run_requests(url, sessions, settings))
    truth = httpx.get(url + "/truth", timeout=30, trust_env=False).json()
    by_id = {str(e["index"]): e for e in truth}
    by_id.update({f"chatcmpl-{e['index']}": e for e in truth})
    return records, by_id


@pytest.mark.parametrize("api", ["chat", "generate"])
def test_each_turn_sends_the_conversation_with_the_answers_the_server_returned(spawn, api):
    url = _scripted(spawn)
    sessions = _sessions(3, 3)
    records, truth = _run(url, sessions, api=api, concurrency=2)
    assert all(r.success for r in records), [r.error for r in records]
    assert [(r.session_id, r.turn) for r in records] == [
        (s.id, k) for s in sessions for k in range(3)]  # fmt: skip
    assert [r.index for r in records] == list(range(9))
    for record in records:
        session = sessions[int(record.session_id[1:])]
        messages = session.messages(record.turn, [ANSWER] * record.turn)
        sent = (" ".join(m["content"] for m in messages) if api == "chat"
                else raw_text(messages))  # what the server hashes of each API's body
        received = truth[record.request_id]["prompt_sha256"]
        assert received == hashlib.sha256(sent.encode()).hexdigest(), record.prompt_id


def test_a_session_holds_its_slot_through_its_turns_and_think_times(spawn):
    url = _scripted(spawn)
    sessions = _sessions(4, 3)
    think = 0.030
    records, truth = _run(url, sessions, api="chat", concurrency=2,
                          think_time=ThinkTime(think))  # fmt: skip
    assert all(r.success for r in records)
    spans = {}
    for session_id, group in itertools.groupby(records, key=lambda r: r.session_id):
        turns = [truth[r.request_id] for r in group]
        for before, after in itertools.pairwise(turns):  # the server's clock
            assert arrived(after) >= before["end_before"] + think
        spans[session_id] = (arrived(turns[0]), turns[-1]["end_before"])
    starts = sorted(spans.values())
    # at most two sessions in flight: each later session began after one of the first ended
    for start, _ in starts[2:]:
        in_flight = [s for s in spans.values() if s[0] < start < s[1]]
        assert len(in_flight) <= 1
    assert starts[1][0] < starts[0][1]  # the first two ran side by side


def test_an_open_loop_of_sessions_keeps_each_turns_intended_instant(spawn):
    url = _scripted(spawn)
    sessions = _sessions(3, 2)
    records, truth = _run(url, sessions, api="generate", concurrency=3, request_rate=20.0,
                          seed=4, think_time=ThinkTime(0.010))  # fmt: skip
    firsts = [r for r in records if r.turn == 0]
    origin = firsts[0].intended_time
    due = list(itertools.accumulate(arrival_gaps(3, 20.0, 4), initial=0.0))[:3]
    assert [r.intended_time - origin for r in firsts] == pytest.approx(due, abs=1e-9)
    for first, second in zip(firsts, [r for r in records if r.turn == 1], strict=True):
        assert second.intended_time == pytest.approx(first.end_time + 0.010, abs=1e-9)
    for record in records:
        assert 0 <= record.dispatch_delay < arrived(truth[record.request_id]) - record.intended_time


def test_a_failed_turn_ends_its_session(spawn, monkeypatch: pytest.MonkeyPatch):
    url = _scripted(spawn)
    real = sessionsend.send_one

    async def failing(http, url, body, record, *args, **kwargs):
        await real(http, url, body, record, *args, **kwargs)
        if (record.session_id, record.turn) == ("s1", 1):
            record.success, record.error = False, "HTTP 500: injected"
        return record

    monkeypatch.setattr(sessionsend, "send_one", failing)
    records, truth = _run(url, _sessions(3, 3), api="chat", concurrency=3)
    assert [(r.session_id, r.turn) for r in records if r.session_id == "s1"] == [
        ("s1", 0), ("s1", 1)]  # fmt: skip
    assert sum(r.session_id != "s1" for r in records) == 6
    assert len(truth) == 2 * 8  # two keys per request: the server never saw s1's third turn


def test_a_mission_on_a_named_agentic_workload_sends_sessions_and_splits_by_turn(small_mission):
    """``--kimi-workload agentic`` on the mock: the named workload over the file's, sessions
    of three turns, each turn carrying the one before (its prompt grows by the earlier turn
    and its answer), figures per turn, and the manifest naming the sessions."""
    agentic = """
workloads:
  agentic:
    kind: agentic
    num_requests: 4
    output_len: 8
    turns: 3
    system_prompt_tokens: 600
    task_tokens: 100
    tool_result_tokens: 200
    think_time: {seconds: 2.0}
"""
    run = small_mission("--kimi-workload=agentic", extra=agentic)
    lines = (run / "wide" / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    warm = [r for r in records if r["warmup"]]
    measured = [r for r in records if not r["warmup"]]
    assert len(warm) == 1 and warm[0]["session_id"] is None  # a first turn, sent alone
    assert sorted((r["session_id"], r["turn"]) for r in measured) == [
        (f"agent-{i:04d}", k) for i in range(1, 5) for k in range(3)]  # fmt: skip
    assert all(r["success"] for r in measured)
    for r in measured:  # the server's prompt count: system + every turn and answer so far
        earlier = (100 + 8) + (200 + 8) * (r["turn"] - 1) if r["turn"] else 0
        grows = earlier + (200 if r["turn"] else 100)
        assert r["prompt_tokens"] >= 600 + grows  # the chat template adds its own tokens
    summary = json.loads((run / "wide" / "summary.json").read_text())
    assert sorted(summary["by_turn"]) == ["0", "1", "2"]
    assert summary["by_turn"]["2"]["completed"] == 4
    manifest = json.loads((run / "wide" / "manifest.json").read_text())
    assert (manifest["workload"]["name"], manifest["workload"]["kind"]) == ("agentic", "agentic")
    assert manifest["workload"]["think_time_s"] == 2.0
    assert manifest["workload"]["dataset"]["session_ids"][1:] == [
        f"agent-{i:04d}" for i in range(1, 5)]  # fmt: skip
