"""The mock server as a process: SGLang's endpoints, stream formats, multi-node start-up."""

from __future__ import annotations

import itertools
import json
import sys

import httpx
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR


def _events(response: httpx.Response) -> list:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_info_endpoints_report_args(mock_server):
    info = httpx.get(mock_server + "/get_server_info").json()
    assert info["tp_size"] == 8
    assert "unrecognized_args" not in info and "kimi_mock" not in info  # SGLang has neither
    assert httpx.get(mock_server + "/server_info").json()["tp_size"] == 8
    model = httpx.get(mock_server + "/model_info").json()
    assert model["model_path"] == str(TOKENIZER_DIR)
    assert httpx.get(mock_server + "/get_model_info").json() == model
    models = httpx.get(mock_server + "/v1/models").json()
    assert models["data"][0]["id"] == str(TOKENIZER_DIR)
    assert httpx.get(mock_server + "/health_generate").status_code == 200
    assert httpx.post(mock_server + "/flush_cache").status_code == 200


def test_generate_streams_cumulative_text_and_meta_info(mock_server):
    body = {"text": "bago bala bago", "sampling_params": {"max_new_tokens": 5}, "stream": True}
    events = _events(httpx.post(mock_server + "/generate", json=body, timeout=10))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5]
    assert all(c["meta_info"]["prompt_tokens"] == 3 for c in chunks)
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative
    assert len(texts[-1].split()) == 5
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert chunks[0]["meta_info"]["finish_reason"] is None
    assert [("e2e_latency" in c["meta_info"]) for c in chunks] == [False] * 4 + [True]


def test_completions_stream_ends_with_usage_chunk(mock_server):
    body = {
        "model": "m",
        "prompt": "a b c d",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = _events(httpx.post(mock_server + "/v1/completions", json=body, timeout=10))
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == []
    assert usage["usage"] == {  # SGLang's usage-only chunk: no token details, reasoning 0
        "prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7, "reasoning_tokens": 0,
    }  # fmt: skip
    texts = [e["choices"][0]["text"] for e in events[:-2]]
    assert len(texts) == 3 and all(len(t.split()) == 1 for t in texts)


def test_real_openai_client_works_against_the_mock(mock_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=mock_server + "/v1", api_key="none")
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "a b c"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, usage = [], None
    for chunk in stream:
        if chunk.choices:
            content.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert len("".join(content).split()) == 4
    assert usage.completion_tokens == 4 and usage.prompt_tokens == 3
    whole = client.completions.create(model="m", prompt="a b", max_tokens=2)
    assert len(whole.choices[0].text.split()) == 2


def test_metrics_use_sglang_names(mock_server):
    from pytest_kimi.results.replicacounters import server_totals

    before = server_totals(httpx.get(mock_server + "/metrics").text)
    body = {"text": "a b c", "sampling_params": {"max_new_tokens": 2}}
    for _ in range(3):
        httpx.post(mock_server + "/generate", json=body, timeout=10).raise_for_status()
    text = httpx.get(mock_server + "/metrics").text
    assert "sglang:num_running_reqs{" in text
    assert "sglang:num_queue_reqs{" in text
    assert "sglang:generation_tokens_total{" in text
    after = server_totals(text)
    # 0.5.9 exports the gauge from start-up; its first value comes with a decode log (every
    # 40 decode steps): none yet
    assert after["sglang:spec_accept_length"] == 0.0
    after.pop("sglang:spec_accept_length")
    grown = {k: after[k] - before.get(k, 0.0) for k in after}
    assert grown == {  # counted when each request finished, as SGLang's tokenizer manager does
        "sglang:num_requests_total": 3,
        "sglang:prompt_tokens_total": 9,
        "sglang:generation_tokens_total": 6,
        # SGLang's radix cache is on by default: the second and third "a b c" find "a b"
        # cached (never the prompt's last token)
        "sglang:cached_tokens_total": 4,
    }


def test_mock_only_conveniences_need_their_flags(spawn, mock_cmd):
    port = free_port()
    flags = ("--mock-replica-header", "--mock-server-info-extras", "--schedule-policy", "lpm")
    proc = spawn(mock_cmd(port, "--mock-time-scale", "1000", *flags), "mock")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    info = httpx.get(url + "/get_server_info").json()
    assert info["unrecognized_args"] == ["--schedule-policy", "lpm"]
    assert info["kimi_mock"]["time_scale"] == 1000
    body = {"text": "a", "sampling_params": {"max_new_tokens": 2}, "stream": True}
    response = httpx.post(url + "/generate", json=body, timeout=10)
    assert response.headers["x-kimi-replica"] == f"127.0.0.1:{port}"
    assert _events(response)[0]["meta_info"]["kimi_replica"] == f"127.0.0.1:{port}"


def test_ground_truth_has_model_side_timings(mock_server):
    body = {"text": "a b", "sampling_params": {"max_new_tokens": 3}}
    httpx.post(mock_server + "/generate", json=body, timeout=10).raise_for_status()
    truth = httpx.get(mock_server + "/kimi/ground_truth").json()
    assert truth["time_scale"] == 1000
    req = truth["requests"][-1]
    assert req["prompt_tokens"] == 2 and len(req["token_times"]) == 3
    assert req["arrival"] <= req["first_token"] <= req["finished"]


def test_bad_request_is_a_400_with_a_message(mock_server):
    response = httpx.post(mock_server + "/v1/chat/completions", json={"messages": []})
    assert response.status_code == 400
    assert response.json() == {  # SGLang's ErrorResponse: flat
        "object": "error", "message": "Messages cannot be empty.", "type": "BadRequestError",
        "param": None, "code": 400,
    }  # fmt: skip


def test_rank0_serves_only_after_all_ranks_join(spawn, mock_cmd):
    dist, p0, p1, p2 = free_port(), free_port(), free_port(), free_port()
    common = [
        "--nnodes",
        "3",
        "--dist-init-addr",
        f"127.0.0.1:{dist}",
        "--tp-size",
        "8",
        "--pp-size",
        "3",
    ]
    rank0 = spawn(mock_cmd(p0, *common, "--node-rank", "0"), "rank0")
    rank1 = spawn(mock_cmd(p1, *common, "--node-rank", "1"), "rank1")
    rank1.wait_http(f"http://127.0.0.1:{p1}/health")  # dummy health, answers at once
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{p0}/health", timeout=0.5)  # rank 2 has not joined
    spawn(mock_cmd(p2, *common, "--node-rank", "2"), "rank2")
    rank0.wait_http(f"http://127.0.0.1:{p0}/health")
    assert "The server is fired up and ready to roll!" in rank0.text()


def test_rank0_names_missing_ranks_and_exits_nonzero(spawn, mock_cmd):
    dist, p0 = free_port(), free_port()
    rank0 = spawn(
        mock_cmd(
            p0,
            "--nnodes",
            "3",
            "--node-rank",
            "0",
            "--dist-init-addr",
            f"127.0.0.1:{dist}",
            "--mock-join-timeout",
            "0.5",
        ),
        "rank0",
    )
    assert rank0.popen.wait(timeout=20) == 1
    assert "node rank(s) 1, 2 of 3 did not join" in rank0.text()


def test_worker_rank_exits_when_rank0_goes_away(spawn, mock_cmd):
    dist, p0, p1 = free_port(), free_port(), free_port()
    common = ["--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist}"]
    rank0 = spawn(mock_cmd(p0, *common, "--node-rank", "0"), "rank0")
    rank1 = spawn(mock_cmd(p1, *common, "--node-rank", "1"), "rank1")
    rank0.wait_http(f"http://127.0.0.1:{p0}/health")
    rank0.popen.kill()
    assert rank1.popen.wait(timeout=20) == 1
    assert "lost rank 0" in rank1.text()


def test_module_runs_as_drop_in_with_help():
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "pytest_kimi.mock.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for flag in (
        "--tp-size",
        "--pp-size",
        "--ep-size",
        "--dist-init-addr",
        "--node-rank",
        "--chunked-prefill-size",
        "--disable-radix-cache",
        "--mock-time-scale",
    ):
        assert flag in out
