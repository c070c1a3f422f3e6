"""The steps once a deployment is up, before it is measured.

What each node runs recorded for the manifest (asked on every node at once), whether the
router's node has the model the router loads its tokenizer from, and one short warm-up request
per replica, so the first measured request pays no first-use cost and a replica that cannot
answer stops the run before anything is measured (:class:`WarmupFailed`).
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.deploy.executor import Executor
    from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
    from pytest_kimi.deploy.reach import Reach


def node_environments(
    inputs: Inputs, executor: Executor, plan: DeploymentPlan, scope: str, reach: Reach
) -> list[dict]:
    """Per node: hostname, Python, SGLang, GPUs, driver, the variables we set; the router's
    node also the versions its own interpreter sees (``router_software``), each replica's
    head the version its SGLang states over HTTP (``sglang_server_version``). Versions are
    asked the way each process runs (its environment, setup lines and container). Every node
    at once, one thread per node (as the GPU pre-flight): four SSH round trips per node, in
    sequence over 8 nodes, held each bring-up up ~15 s."""
    from pytest_kimi.deploy.envinfo import node_environment, server_version, software
    from pytest_kimi.deploy.gpus import smi_command

    first: dict[str, ProcessSpec] = {}  # the node's first process: the one its probes use
    for spec in plan.processes:
        first.setdefault(spec.node.name, spec)

    def probe(spec: ProcessSpec) -> dict:
        return node_environment(executor, spec, smi_command(inputs.cluster, spec.node, scope))

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(first)))) as pool:
        seen = dict(zip(first, pool.map(probe, first.values()), strict=True))
    router = plan.router
    seen[router.node.name]["router_software"] = software(executor, router)
    for spec in plan.rank0():
        seen[spec.node.name]["sglang_server_version"] = server_version(reach.url(spec.url))
    return list(seen.values())


def with_gpus(environments: list[dict], gpus: list[dict]) -> list[dict]:
    """Each node's environment with its pre-flight record (driver, CUDA, GPUs) added."""
    by_node = {g["node"]: g["gpu_preflight"] for g in gpus}
    for env in environments:
        if env.get("node") in by_node:
            env["gpu_preflight"] = by_node[env["node"]]
    return environments


def router_model_notes(inputs: Inputs, executor: Executor, plan: DeploymentPlan) -> list[str]:
    """The router loads each worker's tokenizer from its model path: is it there?"""
    from pytest_kimi.config.serverargs import resolve_model_path

    cluster = inputs.cluster
    path = cluster.router.model_mount or resolve_model_path(cluster.server.model_path)
    code, _ = executor.run(plan.router.node, f"test -d {shlex.quote(path)}", 30)
    if code == 0:
        return []
    return [
        f"router host {plan.router.node.name} has no {path}: the router cannot load the "
        "workers' tokenizer (harmless for round_robin); mount the model read-only there"
    ]


class WarmupFailed(RuntimeError):
    """A replica failed its warm-up: the run stops before measuring, with the response."""


FAKE_BOOTSTRAP_HOST = "2.2.2.2"
"""SGLang 0.5.9's (``srt/disaggregation/utils.py``): a request to one side of a disaggregated
deployment naming it as its bootstrap host moves no KV; SGLang's own health check sends it."""


def warm_replicas(plan: DeploymentPlan, reach: Reach | None = None) -> None:
    """One short request per replica, straight to rank 0 (not through the router); to a
    prefill or decode server as SGLang's own health check sends one (no KV to move)."""
    from pytest_kimi.deploy.reach import DIRECT
    from pytest_kimi.workload import http

    body = {"text": "warm up", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    alone = {"bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": 0}
    with http.client(timeout=600.0) as warming:
        for spec in plan.rank0():
            sent = {**body, **alone} if spec.disaggregation else body
            response = warming.post((reach or DIRECT).url(spec.url + "/generate"), json=sent)
            if response.status_code != 200:
                raise WarmupFailed(
                    f"warm-up of replica {spec.replica} ({spec.url}/generate) answered HTTP "
                    f"{response.status_code}: {response.text[:300]}"
                )
