"""Faults seen through the real SGLang Router, as a benchmark run sees them.

A DP2 deployment of the product's own plan (two 2-node mock replicas behind
``smg.launch_router --policy round_robin``) is brought up by the deploy layer; faults
are switched on at run time on a replica's rank 0 (``POST /kimi/faults``), and the product's
client sends the workload through the router. Every failed request must carry its reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.deployment import Deployment
from pytest_kimi.deploy.executor import LocalExecutor
from pytest_kimi.deploy.plan import DeploymentPlan, plan_deployment
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests

CLUSTER = (
    (Path(__file__).parent / "small_cluster.yaml")
    .read_text()
    .replace(
        '  env: {HF_ENDPOINT: "http://127.0.0.1:9"}',
        '  env: {HF_ENDPOINT: "http://127.0.0.1:9"}\n'
        "  args: {retry-max-retries: 2, retry-initial-backoff-ms: 10}",
    )
)


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[DeploymentPlan]:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    cluster = load_cluster(path)
    plan = plan_deployment(cluster, cluster.layout("wide"))
    deployment = Deployment(plan, LocalExecutor(), tmp_path / "logs", timeout_s=60)
    with deployment:
        yield plan
    assert deployment.leftovers == []


def _faults(plan: DeploymentPlan, replica: int, **knobs: object) -> None:
    head = plan.rank0()[replica]
    httpx.post(head.url + "/kimi/faults", json=knobs, timeout=5).raise_for_status()


def _run(plan: DeploymentPlan, n: int = 4, timeout_s: float = 60.0) -> list:
    specs = [RequestSpec(f"p{i}", "word " * 64, 64) for i in range(n)]
    options = ClientOptions(output_len=8, concurrency=2, timeout_s=timeout_s)
    return asyncio.run(run_requests(plan.endpoint, specs, options))


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        # sglang-router 0.3 cut the client's stream too; smg ends it with an error event
        # in its own words ("Stream error: error decoding response body: ... unexpected EOF")
        ({"cut_after_tokens": 3}, ("stream ended without [DONE]", "RemoteProtocolError",
                                   "Stream error: error decoding response body")),
        ({"malformed_after_tokens": 2}, ("malformed SSE data",)),
    ],
    ids=["cut-stream", "malformed-sse"],
)
def test_a_broken_stream_through_the_router_is_a_failed_request_with_its_reason(
    deployed: DeploymentPlan, knobs: dict, reason: tuple[str, ...]
):
    _faults(deployed, 0, **knobs)  # replica 0 breaks its streams; replica 1 is fine
    records = _run(deployed)
    failed = [r for r in records if not r.success]
    ok = [r for r in records if r.success]
    assert len(failed) == 2 and len(ok) == 2  # round robin: every other request
    assert all(r.error.startswith(reason) for r in failed), [r.error for r in failed]
    assert all(r.chunks for r in failed)  # what arrived before the break is kept


def test_a_5xx_from_the_router_is_a_failed_request_with_status_and_body(
    deployed: DeploymentPlan,
):
    for replica in (0, 1):  # every worker fails: the router's retries run out
        _faults(deployed, replica, error_rate=1)
    records = _run(deployed, n=2)
    assert all(not r.success for r in records)
    assert all(r.status is not None and r.status >= 500 for r in records)
    assert all(r.error.startswith(f"HTTP {r.status}: ") for r in records), records[0].error


def test_a_request_that_never_ends_times_out_through_the_router(deployed: DeploymentPlan):
    _faults(deployed, 0, stall=True)
    try:
        records = _run(deployed, timeout_s=3.0)
    finally:
        _faults(deployed, 0, stall=False)
    failed = [r for r in records if not r.success]
    assert len(failed) == 2
    assert all(r.error == "timeout: no complete response within 3s" for r in failed)
