"""Attached to a real deployment (``--kimi-endpoint``): the report describes what answered.

The deployment is started by hand (conftest ``real_deployment``): two real SGLang servers
behind the real SGLang Router. The product learns the rest from them: the workers from the
router's ``/workers``, each one's version and arguments from its ``/server_info``, the replica
split from the servers' and the router's counters.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from pytest_kimi.testing.processes import pytest_argv
from pytest_kimi.testing.realsglang import ROOT, installed_release, run_child

pytestmark = pytest.mark.slow

CLUSTER = ROOT / "clusters" / "cpu-sglang.yaml"



def _attach(deployment, out: Path, *args: str, cluster: Path = CLUSTER):
    argv = pytest_argv(
        "tests/perf", "--cluster", str(cluster), "--layout=tp1",
        f"--kimi-endpoint={deployment.url}", f"--kimi-report-dir={out}", "-p",
        "no:cacheprovider", "-rA", *args,
    )  # fmt: skip
    done = run_child(argv, cwd=ROOT, timeout_s=600)
    runs = [p for p in out.iterdir() if p.is_dir()]
    return done, runs[0] if runs else None


@pytest.fixture(scope="module")
def routed(real_deployment, tmp_path_factory):
    """One attached run through the router, its metrics port given: (result, run folder)."""
    out = tmp_path_factory.mktemp(f"routed-{real_deployment.version}")
    return _attach(real_deployment, out, f"--kimi-router-metrics={real_deployment.metrics_url}")


def test_an_attached_run_describes_the_endpoint_it_measured(real_deployment, router, routed):
    version = real_deployment.version
    done, run = routed
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    manifest = json.loads((run / "tp1" / "manifest.json").read_text())
    attached = manifest["attached"]
    assert attached["kind"] == "router"
    # in the router's order, which need not be the order it was given
    assert sorted(w["url"] for w in attached["workers"]) == sorted(
        s.url for s in real_deployment.servers
    )
    assert {w["version"] for w in attached["workers"]} == {version}
    assert all(w["server_info"]["tp_size"] == 1 for w in attached["workers"])
    # the set-up is the endpoint's, as its servers state it: not the cluster file's
    assert manifest["replicas"] == 2 and manifest["layout"]["gpus"] == 2
    assert manifest["layout"]["server_args"]["device"] == "cpu"
    md = (run / "comparison.md").read_text()
    assert f"sglang (servers) {version}" in md
    if router.package.name == "smg":  # smg states its release (/get_loads), read from it
        stated = installed_release(router.python, "smg")
        assert attached["router"] == f"smg {stated}"
        assert f"router (attached) smg {stated}" in md
    else:  # sglang-router 0.3.2 states none; the client's own smg is not it
        assert attached["router"] is None
        assert "router (attached) version not stated by the endpoint" in md
        assert f"smg {metadata.version('smg')}" not in md


def test_an_attached_run_splits_requests_by_the_workers_counters(routed):
    done, run = routed
    assert done.returncode == 0, done.stdout[-5000:]
    summary = json.loads((run / "tp1" / "summary.json").read_text())
    counters = summary["replica_counters"]
    assert sum(c["requests"] for c in counters.values()) == summary["completed"] == 16
    assert all(c["requests"] > 0 for c in counters.values())
    # and the router's own count per worker, from its metrics port
    assert sum(c["router_requests"] for c in counters.values()) == 16
    assert any(n.startswith("requests per replica: replica0: ") for n in summary["notes"])


def test_a_run_in_which_every_request_fails_fails_the_workload_test(real_deployment, tmp_path):
    # prompts longer than the servers' context (4096): real SGLang answers each with an error
    words = " ".join(["bago"] * 5000)
    rows = [{"question_id": f"long-{i}", "category": "long", "turns": [words]} for i in range(4)]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = CLUSTER.read_text()
    for old, new in (("dataset: cpu-sglang-prompts.jsonl", "dataset: long.jsonl"),
                     ("num_requests: 16", "num_requests: 4"), ("input_len: 512", "input_len: 5000"),
                     ("warmup_requests: 1", "warmup_requests: 0"),
                     ("prompt: chat_template", "prompt: raw")):  # fmt: skip
        assert old in text
        text = text.replace(old, new)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    done, run = _attach(real_deployment, out, cluster=cluster)
    assert done.returncode == 1, done.stdout[-5000:]
    assert "FAILED tests/perf/test_speedbench.py::test_workload[tp1]" in done.stdout
    assert "no request succeeded (4 failed)" in done.stdout
    assert "FAILED tests/perf/test_speedbench.py::test_every_request_succeeded[tp1]" in done.stdout
    records = [json.loads(x) for x in (run / "tp1" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and not any(r["success"] for r in records)
    assert all(r["error"] for r in records)  # each kept with the server's reason


@pytest.fixture(scope="module")
def openai_on_a_server(real_deployment, tmp_path_factory):
    """One attached run of both OpenAI APIs against a server itself: (result, run folder)."""
    out = tmp_path_factory.mktemp(f"openai-{real_deployment.version}")
    return _attach_to(real_deployment.servers[0].url, out, "--kimi-api=completions,chat")


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_streams_place_every_token_where_each_chunk_is_counted(openai_on_a_server, api):
    # attached to a server itself (no router between): continuous_usage_stats reaches it,
    # so every token of a merged chunk, and every token without text, is placed
    done, run = openai_on_a_server
    assert done.returncode == 0, done.stdout[-5000:]
    lines = (run / "tp1" / api / "records.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 16
    for r in measured:
        tokens = [c["tokens"] for c in r["chunks"]]
        assert sum(tokens) == r["completion_tokens"] == 32, (r["prompt_id"], tokens)
        assert sum(max(t, 1) for t in tokens[1:]) == 32 - tokens[0], (r["prompt_id"], tokens)
    manifest = json.loads((run / "tp1" / "manifest.json").read_text())
    assert manifest["attached"]["kind"] == "server" and manifest["replicas"] == 1


def test_only_the_old_router_drops_per_chunk_usage_that_the_servers_send(real_deployment, router):
    # the fact behind the mission's "ITL: N tokens could not be placed" note: the same request
    # has a count in every chunk from a server, none through sglang-router 0.3.2, and every
    # one through smg
    import httpx

    body = {"model": "m", "prompt": "bago bagu bala", "max_tokens": 4, "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip

    def usages(url: str) -> list:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60,
                          trust_env=False) as response:  # fmt: skip
            events = [json.loads(line[5:]) for line in response.iter_lines()
                      if line.startswith("data:") and "[DONE]" not in line]  # fmt: skip
        return [e.get("usage") for e in events if e.get("choices")]

    assert all(u is not None for u in usages(real_deployment.servers[0].url))
    through = usages(real_deployment.url)
    if router.package.name == "sglang-router":
        assert all(u is None for u in through), through
    else:
        assert all(u is not None for u in through), through


def test_an_agentic_workload_hits_the_servers_prefix_cache_as_their_counters_say(
    real_deployment, tmp_path
):
    """``--kimi-workload agentic`` (clusters/cpu-sglang.yaml) against one real server: sessions
    of three turns whose prompts share a system prompt and grow by each answer. Each turn is
    sent after the one before it finished on that same server, so SGLang's radix cache holds
    it: every later turn reports at least the previous turn's prompt as cached, every first
    turn finds the system prompt the warm-up left, and the records' sum is what the server's
    own sglang:cached_tokens_total grew by. (Behind round robin none of this is certain: a
    turn can reach the server whose requests of the run have not finished yet.)"""
    done, run = _attach_to(real_deployment.servers[0].url, tmp_path, "--kimi-workload=agentic")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    lines = (run / "tp1" / "records.jsonl").read_text().splitlines()
    measured = [r for r in map(json.loads, lines) if not r["warmup"]]
    assert len(measured) == 4 * 3 and all(r["success"] for r in measured)
    turns = {(r["session_id"], r["turn"]): r for r in measured}
    for (session, turn), r in turns.items():
        before = turns[session, turn - 1]["prompt_tokens"] if turn else 1
        assert r["cached_tokens"] >= before, (session, turn, r["cached_tokens"], before)
    summary = json.loads((run / "tp1" / "summary.json").read_text())
    cached = sum(r["cached_tokens"] for r in measured)
    assert summary["cached_tokens_total"] == cached
    servers = sum(c["cached_tokens"] for c in summary["replica_counters"].values())
    assert servers == cached
    assert f"the replicas' cache counters agree with the responses' cached_tokens " \
           f"({cached} tokens)" in summary["notes"]
    by_turn = summary["by_turn"]
    assert sorted(by_turn) == ["0", "1", "2"]
    assert sum(by_turn[k]["cached_tokens_total"] for k in by_turn) == cached
    assert by_turn["2"]["cached_tokens_total"] > by_turn["1"]["cached_tokens_total"]


def test_a_trace_replays_on_its_schedule_and_real_sglang_caches_its_shared_blocks(
    real_deployment, tmp_path
):
    """``--kimi-workload trace`` (clusters/cpu-sglang-trace.jsonl) against one real server:
    requests due at the trace's timestamps, each with its own answer length; a request whose
    first blocks an earlier, finished request shared (equal hash_ids) finds at least those
    blocks in SGLang's radix cache, as its meta_info says."""
    server = real_deployment.servers[0]
    done, run = _attach_to(server.url, tmp_path, "--kimi-workload=trace")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    records = [json.loads(x) for x in (run / "tp1" / "records.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (ROOT / "clusters" / "cpu-sglang-trace.jsonl")
            .read_text().splitlines()]  # fmt: skip
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 8 and all(r["success"] for r in measured)
    origin = measured[0]["intended_time"]
    assert [r["intended_time"] - origin for r in measured] == pytest.approx(
        [(row["timestamp"] - rows[1]["timestamp"]) / 1000 for row in rows[1:]], abs=1e-9)
    blocks = {f"trace-{i + 1}": row["hash_ids"] for i, row in enumerate(rows)}
    assert [r["completion_tokens"] for r in records] == [row["output_length"] for row in rows]
    hits = 0
    for r in measured:
        before = [e for e in records if e["end_time"] < r["start_time"]]
        shared = max((_common(blocks[e["prompt_id"]], blocks[r["prompt_id"]]) for e in before),
                     default=0)  # fmt: skip
        assert r["cached_tokens"] >= 512 * shared, (r["prompt_id"], shared, r["cached_tokens"])
        hits += shared > 0
    # rows 3, 6 and 8 share blocks with row 1, the warm-up, which ended before any was sent
    assert hits >= 3


def _common(a: list[int], b: list[int]) -> int:
    """Leading blocks two requests share (the last block is partial: never counted whole)."""
    n = 0
    for x, y in zip(a[:-1], b[:-1], strict=False):
        if x != y:
            break
        n += 1
    return n


def _attach_to(url: str, out: Path, *args: str):
    argv = pytest_argv(
        "tests/perf", "--cluster", str(CLUSTER), "--layout=tp1", f"--kimi-endpoint={url}",
        f"--kimi-report-dir={out}", "-p", "no:cacheprovider", *args,
    )  # fmt: skip
    done = run_child(argv, cwd=ROOT, timeout_s=600)
    runs = [p for p in out.iterdir() if p.is_dir()]
    return done, runs[0] if runs else None


def test_the_mock_finds_in_its_prefix_cache_what_real_sglang_finds(real_deployment, tmp_path):
    """One conversation sent turn by turn, each turn with the answer the server gave, to a
    real server (its cache flushed first) and to a mock of the same version: every turn
    reports the same cached prompt tokens (0.5.9 keeps an answer's last token in its tree,
    0.5.23 does not), the same ``cached_tokens_details``, and the same growth of
    ``sglang:cached_tokens_total``."""
    from pytest_kimi.deploy.ports import free_port
    from pytest_kimi.testing.processes import Proc, mock_argv

    real = real_deployment.servers[0].url
    port = free_port()
    mock = Proc(mock_argv(port, "--tp-size", "1", "--mock-time-scale", "1000", "--enable-metrics",
                          "--mock-sglang-version", real_deployment.version,
                          "--max-total-tokens", "32768"), tmp_path / "mock.log")  # fmt: skip
    try:
        mock.wait_http(f"http://127.0.0.1:{port}/health")
        seen = {url: _conversation(url) for url in (real, f"http://127.0.0.1:{port}")}
    finally:
        mock.stop()
    [(real_turns, real_grew), (mock_turns, mock_grew)] = seen.values()
    kept = 1 if real_deployment.version == "0.5.9" else 0  # the answer's last token
    assert [t[0] for t in real_turns] == [0, 250 + 7 + kept, 300 + 7 + kept]
    assert mock_turns == real_turns and mock_grew == real_grew == sum(t[0] for t in real_turns)


def _conversation(url: str) -> tuple[list[tuple[int, object]], float]:
    """Three turns of one conversation on ``url`` (250, 300 and 352 prompt tokens, 8-token
    answers): each turn's (cached tokens, details), and how much the server's cached-token
    counter grew (read until it has counted every turn: SGLang counts a request as its last
    output leaves, and its metrics files may trail the answer)."""
    import time

    import httpx

    from pytest_kimi.results.replicacounters import CACHED_TOKENS, server_totals

    def counted() -> float:
        return server_totals(httpx.get(url + "/metrics", timeout=30).text).get(CACHED_TOKENS, 0.0)

    httpx.post(url + "/flush_cache", timeout=30)
    before, turns = counted(), []
    convo = " ".join(["bago", "bala", "bagu"] * 70)
    for k in range(3):
        convo += " " + " ".join(["bala", "bagu"] * (20 + k))
        body = {"text": convo, "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                    "ignore_eos": True}}  # fmt: skip
        answer = httpx.post(url + "/generate", json=body, timeout=300).json()
        meta = answer["meta_info"]
        turns.append((meta["cached_tokens"], meta.get("cached_tokens_details")))
        convo += " " + answer["text"].strip()
    expected, deadline = sum(t[0] for t in turns), time.monotonic() + 30
    while (grew := counted() - before) < expected and time.monotonic() < deadline:
        time.sleep(0.2)  # polled until counted: the assertion compares what it reached
    return turns, grew
