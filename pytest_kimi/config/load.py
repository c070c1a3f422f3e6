"""``load_cluster``: read the YAML, validate it, check it, build the frozen records.

Three steps, each with one job: :mod:`~pytest_kimi.config.models` checks every field on its
own, :mod:`~pytest_kimi.config.checks` the rules between fields and the values other modules
parse, and this module turns the result into the records of
:mod:`~pytest_kimi.config.cluster` (defaults resolved: ``python: current``, ``auto`` ports,
the router's node, per-node SSH settings).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import ValidationError

from pytest_kimi.config import checks, models
from pytest_kimi.config.cluster import (
    ClusterConfig,
    Layout,
    MockConfig,
    Node,
    PreflightConfig,
    RouterConfig,
    ServerConfig,
    SSHConfig,
    TelemetryConfig,
    WorkloadConfig,
)
from pytest_kimi.config.errors import config_error
from pytest_kimi.yamlfile import Located, read_yaml


def load_cluster(path: Path | str) -> ClusterConfig:
    """Read and validate a cluster file; any problem is a :class:`ConfigError`."""
    path = Path(path)
    src = read_yaml(path)
    try:
        raw = models.ClusterFile.model_validate(src.data)
    except ValidationError as exc:
        raise config_error(src, exc, models.ClusterFile) from None
    checks.check_cluster(src, raw)
    return _cluster(src, raw)


def _cluster(src: Located, raw: models.ClusterFile) -> ClusterConfig:
    """The records, with the values other modules parse checked and parsed here, once."""
    nodes = tuple(_node(n, raw.ssh) for n in raw.nodes)
    layouts = {name: _layout(src, name, layout) for name, layout in raw.layouts.items()}
    checks.check_slos(src, "slo", raw.slo)
    mock = None
    if raw.mock is not None:
        checks.check_profile(src, raw.mock.profile)
        mock = MockConfig(raw.mock.time_scale, raw.mock.seed, dict(raw.mock.profile))
    return ClusterConfig(
        path=src.path,
        name=raw.name,
        executor=raw.executor,
        nodes=nodes,
        replicas=raw.deployment.replicas,
        nodes_per_replica=raw.deployment.nodes_per_replica,
        layouts=layouts,
        server=_server(raw.server),
        router=_router(raw.router, nodes),
        workload=_workload(src, raw.workload),
        slo=dict(raw.slo),
        mock=mock,
        startup_timeout_s=raw.startup_timeout_s,
        source=src,
        work_dir=raw.work_dir,
        regression=dict(raw.regression),
        regression_thresholds=checks.regression_thresholds(src, raw.regression),
        telemetry=TelemetryConfig(raw.telemetry.enabled, raw.telemetry.interval_s),
        preflight=PreflightConfig(raw.preflight.enabled, raw.preflight.busy_memory_mib),
        nvidia_smi=tuple(raw.nvidia_smi),
    )


def _node(node: models.NodeModel, defaults: models.SSH) -> Node:
    """A node's SSH settings: the cluster's defaults, overridden by what the node sets."""
    own = node.ssh.model_dump(include=node.ssh.model_fields_set)
    ssh = SSHConfig(**{**defaults.model_dump(), **own})
    return Node(name=node.name, host=node.host, gpus=node.gpus, ssh=ssh, env=dict(node.env))


def _layout(src: Located, name: str, layout: models.LayoutModel) -> Layout:
    checks.check_slos(src, f"layouts.{name}.slo", layout.slo)
    return Layout(name, layout.tp, layout.pp, layout.ep, tuple(layout.slo.items()))


def _python(value: str) -> str:
    """``current`` means the interpreter running pytest (local clusters)."""
    return sys.executable if value == "current" else value


def _port(value: int | str) -> int | None:
    return None if value == "auto" else int(value)


def _server(server: models.Server) -> ServerConfig:
    return ServerConfig(
        python=_python(server.python),
        module=server.module,
        model_path=server.model_path,
        wrapper=tuple(server.wrapper),
        port=_port(server.port),
        dist_init_port=_port(server.dist_init_port),
        args=dict(server.args),
        env=dict(server.env),
    )


def _router(router: models.Router, nodes: tuple[Node, ...]) -> RouterConfig:
    return RouterConfig(
        python=_python(router.python),
        module=router.module,
        node=router.node or nodes[0].name,
        port=_port(router.port),
        prometheus_port=_port(router.prometheus_port),
        policy=router.policy,
        args=dict(router.args),
        env=dict(router.env),
        wrapper=tuple(router.wrapper),
        model_mount=router.model_mount,
    )


def _workload(src: Located, workload: models.Workload) -> WorkloadConfig:
    goodput = workload.goodput.model_dump(exclude_none=True)
    return WorkloadConfig(
        dataset=workload.dataset,
        num_requests=workload.num_requests,
        input_len=workload.input_len,
        output_len=workload.output_len,
        concurrency=workload.concurrency,
        warmup_requests=workload.warmup_requests,
        api=workload.api,
        seed=workload.seed,
        category=workload.category,
        request_timeout_s=workload.request_timeout_s,
        request_rate=float(workload.request_rate),
        percentiles=tuple(workload.percentiles),
        goodput=goodput,
        goodput_ms=checks.goodput_ms(src, goodput),
        speedbench_config=workload.speedbench_config,
        prompt=workload.prompt,
    )
