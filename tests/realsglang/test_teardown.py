"""Teardown's KILL path, on a real server that does not exit on SIGTERM.

The mock exits at once on SIGTERM; real SGLang drains its requests first ("Gracefully
exiting... Remaining number of requests 1"), and a request that cannot finish soon keeps it
running well past any grace period (a PD decode server waiting for KV never exits). Only a
real server shows that teardown then kills it, with the scheduler and detokenizer processes
it started, and says so.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.deployment import Deployment
from pytest_kimi.deploy.executor import LocalExecutor
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.testing.realsglang import (
    ROOT,
    START_TIMEOUT_S,
    assert_no_standin_calls,
    pids_with_env,
    venv_dir,
)

pytestmark = pytest.mark.slow

GRACE_S = 2.0
LONG_OUTPUT = 3000  # tokens: seconds of decoding on any CPU, far past the grace period


def _one_replica(tmp_path: Path, version: str, mark: str) -> Path:
    text = (ROOT / "clusters" / "cpu-sglang.yaml").read_text()
    text = text.replace("  replicas: 2            # DP2 through the router", "  replicas: 1")
    text = text.replace("model_path: pytest_kimi/data/tiny-model",
                        f"model_path: {ROOT / 'pytest_kimi/data/tiny-model'}")  # fmt: skip
    # a marker every process of the server inherits, down to its scheduler and detokenizer
    env = '    OMP_NUM_THREADS: "1"\n'
    text = text.replace(env, f"{env}    KIMI_TEST_RUN: {mark}\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def _stream_until_first_token(url: str, started: threading.Event) -> None:
    body = {"text": "bago bagu bala", "stream": True,
            "sampling_params": {"max_new_tokens": LONG_OUTPUT, "ignore_eos": True}}  # fmt: skip
    try:
        with httpx.stream("POST", url + "/generate", json=body, timeout=120,
                          trust_env=False) as response:  # fmt: skip
            for line in response.iter_lines():
                if line.startswith("data:"):
                    started.set()
    except httpx.HTTPError:
        pass  # the server is killed under it: the point of the test
    finally:
        started.set()


def test_a_server_draining_past_the_grace_period_is_killed_with_its_children(
    sglang_version: str, sglang_python: Path, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    environ = {**os.environ, "KIMI_SGLANG_VENV": str(venv_dir(sglang_version))}
    cluster = load_cluster(_one_replica(tmp_path, sglang_version, mark), environ=environ)
    plan = plan_deployment(cluster, cluster.layout("tp1"))
    deployment = Deployment(plan, LocalExecutor(), tmp_path / "logs",
                            timeout_s=START_TIMEOUT_S, grace_s=GRACE_S)  # fmt: skip
    started = threading.Event()
    with deployment:
        [server] = plan.servers
        assert len(pids_with_env("KIMI_TEST_RUN", mark)) >= 3  # server, scheduler, detokenizer
        streamer = threading.Thread(target=_stream_until_first_token,
                                    args=(server.url, started), daemon=True)  # fmt: skip
        streamer.start()
        assert started.wait(60), "the long request never started streaming"
    # leaving the block tore down: TERM, a server still draining after GRACE_S, then KILL
    # the router (smg) keeps its listener 5 s past SIGTERM (its drain settle, not settable
    # from its launcher): a 2 s grace kills it too, and that is all it may kill besides
    assert server.name in deployment.killed and set(deployment.killed) <= {server.name, "router"}
    assert deployment.leftovers == []
    assert pids_with_env("KIMI_TEST_RUN", mark) == []  # the scheduler and detokenizer too
    log = (tmp_path / "logs" / f"{server.name}.log").read_text(errors="replace")
    assert "SIGTERM received" in log  # it was asked to stop, and drained instead
    assert_no_standin_calls([tmp_path / "logs" / f"{server.name}.log"])
    streamer.join(30)
