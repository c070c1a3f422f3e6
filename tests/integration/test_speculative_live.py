"""A speculating mock server as a process: what SGLang 0.5.9 says under speculative decoding.

The prompts are SPEED-Bench's tiers from the shipped synthetic file, so the acceptance the
server derives from them is the one a run sees. What is checked is what a real server sends:
``meta_info``'s ``spec_*`` keys on the finished request only (tokenizer_manager.py), several
tokens per chunk, the ``sglang:spec_accept_length`` gauge, ``avg_spec_accept_length`` in
``/get_server_info``, and OpenAI deltas that carry every token's text.
"""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from pytest_kimi.config.versions import NEWEST_SGLANG, SGLangProfile
from pytest_kimi.deploy.ports import free_port
from pytest_kimi.mock.speculative import A_MAX, A_MIN, accept_length
from pytest_kimi.results.replicacounters import SPEC_ACCEPT_LENGTH, server_totals
from pytest_kimi.workload.dataset import load_workload, resolve_dataset
from pytest_kimi.workload.stream import StreamParser

NEW_TOKENS = 200


@pytest.fixture(scope="module")
def tiers() -> dict[str, str]:
    """One prompt of each SPEED-Bench tier."""
    workload = load_workload(resolve_dataset("builtin:speedbench16k"), num_requests=48, seed=1)
    out: dict[str, str] = {}
    for prompt in workload.prompts:
        out.setdefault(prompt.category, prompt.text)
    return out


@pytest.fixture
def eagle(spawn) -> str:
    port = free_port()
    flags = ["--tp-size", "32", "--nnodes", "1", "--mock-gpus-per-node", "32",
             "--enable-metrics", "--mock-time-scale", "2000", "--decode-log-interval", "10",
             "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d",
             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]  # fmt: skip
    from pytest_kimi.testing.processes import mock_argv

    proc = spawn(mock_argv(port, *flags), "eagle")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return url


def _stream(url: str, path: str, body: dict) -> list:
    with httpx.stream("POST", url + path, json=body, timeout=60) as response:
        response.raise_for_status()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def _generate(url: str, text: str) -> list[dict]:
    body = {"text": text, "sampling_params": {"max_new_tokens": NEW_TOKENS}, "stream": True}
    events = _stream(url, "/generate", body)
    assert events[-1] == "[DONE]"
    return events[:-1]


def test_meta_info_carries_sglangs_spec_keys_on_the_finished_request(eagle, tiers):
    chunks = _generate(eagle, tiers["low_entropy"])
    last = chunks[-1]["meta_info"]
    assert last["completion_tokens"] == NEW_TOKENS
    assert not any("spec_verify_ct" in c["meta_info"] for c in chunks[:-1])
    verify = last["spec_verify_ct"]
    # the first token is the prefill's; every later chunk is one verify step of 1..4 tokens
    assert len(chunks) - 1 == verify
    assert last["spec_accept_length"] == pytest.approx(NEW_TOKENS / verify)
    keys = SGLangProfile(NEWEST_SGLANG).spec_keys  # the mock answers as the newest release
    assert last[keys["drafted"]] == verify * 3
    assert last["spec_accept_rate"] == pytest.approx(last[keys["accepted"]] / (verify * 3))
    assert sum(last[keys["histogram"]]) == verify
    steps = [b["meta_info"]["completion_tokens"] - a["meta_info"]["completion_tokens"]
             for a, b in itertools.pairwise(chunks)]  # fmt: skip
    assert set(steps) <= {1, 2, 3, 4} and max(steps) > 1
    # what the product's client keeps of it
    parser = StreamParser("generate")
    for chunk in chunks:
        parser.feed(chunk)
    assert (parser.spec_verify_ct, parser.spec_accept_length) == (
        verify, last["spec_accept_length"])  # fmt: skip


def test_low_entropy_text_accepts_more_drafts_than_high_entropy(eagle, tiers):
    length = {tier: _generate(eagle, tiers[tier])[-1]["meta_info"]["spec_accept_length"]
              for tier in ("low_entropy", "mixed", "high_entropy")}  # fmt: skip
    assert length["low_entropy"] > length["mixed"] > length["high_entropy"], length
    # within the model's span: 200 draws of the chain at acceptance A_MIN .. A_MAX
    assert accept_length(A_MIN, 3) - 0.3 < length["high_entropy"] < length["low_entropy"]
    assert length["low_entropy"] < accept_length(A_MAX, 3) + 0.3


def test_the_server_reports_its_accept_length_as_sglang_does(eagle, tiers):
    for _ in range(2):
        _generate(eagle, tiers["mixed"])
    gauge = server_totals(httpx.get(eagle + "/metrics").text)[SPEC_ACCEPT_LENGTH]
    assert 1.0 < gauge <= 4.0
    state = httpx.get(eagle + "/get_server_info").json()["internal_states"][0]
    assert 1.0 < state["avg_spec_accept_length"] <= 4.0
    # SGLang's resolution of the flags: 48 running requests, mixed chunks off
    assert state["max_running_requests"] == 48 and state["enable_mixed_chunk"] is False
    assert state["speculative_num_draft_tokens"] == 4


def test_openai_deltas_carry_every_accepted_token(eagle, tiers):
    body = {"model": "m", "messages": [{"role": "user", "content": tiers["low_entropy"]}],
            "max_tokens": NEW_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = _stream(eagle, "/v1/chat/completions", body)
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in events[:-1] if c["choices"])  # fmt: skip
    assert len(text.split()) == NEW_TOKENS
    assert events[-2]["usage"]["completion_tokens"] == NEW_TOKENS


def test_sglangs_refusals_are_the_mocks(spawn):
    """Pipeline parallelism with speculative decoding: SGLang 0.5.9's start-up assertion."""
    import subprocess

    from pytest_kimi.testing.processes import mock_argv

    done = subprocess.run(
        mock_argv(free_port(), "--pp-size", "8", "--speculative-algorithm", "NEXTN"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Pipeline parallelism is not compatible" in done.stderr


def test_a_step_that_ends_the_thinking_is_split_as_sglangs_parser_splits_it(spawn, tiers):
    """A reasoning model that speculates: one step can hold the last thinking tokens and the
    first answer tokens; SGLang streams its reasoning part, then its content part."""
    from pytest_kimi.testing.processes import mock_argv

    port = free_port()
    proc = spawn(mock_argv(port, "--tp-size", "8", "--mock-time-scale", "2000",
                           "--mock-reasoning-tokens", "7", "--speculative-algorithm", "EAGLE3",
                           "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
                 "thinking")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    body = {"model": "m", "messages": [{"role": "user", "content": tiers["low_entropy"]}],
            "max_tokens": 40, "stream": True}  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in _stream(url, "/v1/chat/completions", body)[:-1]
              if c["choices"]]  # fmt: skip
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    answer = "".join(d.get("content") or "" for d in deltas)
    assert (len(thought.split()), len(answer.split())) == (7, 33)
    kinds = ["reasoning" if d.get("reasoning_content") else "answer" for d in deltas
             if d.get("reasoning_content") or d.get("content")]  # fmt: skip
    assert kinds == sorted(kinds, key=lambda k: k == "answer")  # all thinking, then all answer
