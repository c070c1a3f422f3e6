"""``load_cluster``: read the YAML, validate it, check it, build the frozen records.

Three steps, each with one job: :mod:`~pytest_kimi.config.models` checks every field on its
own, :mod:`~pytest_kimi.config.checks` the rules between fields and the values other modules
parse, and this module turns the result into the records of
:mod:`~pytest_kimi.config.cluster` (defaults resolved: ``python: current``, ``auto`` ports,
the router's node, per-node SSH settings).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_kimi.config import (
    checks,
    layoutmodels,
    models,
    nodemodels,
    processmodels,
    variables,
    workloadmodels,
)
from pytest_kimi.config.cluster import ClusterConfig
from pytest_kimi.config.errors import config_error
from pytest_kimi.config.points import SWEPT
from pytest_kimi.config.processes import ContainerConfig, MockConfig, RouterConfig, ServerConfig
from pytest_kimi.config.runsettings import (
    LockConfig,
    LogsConfig,
    NetworkConfig,
    PreflightConfig,
    TelemetryConfig,
    WatchdogConfig,
    WorkloadConfig,
)
from pytest_kimi.config.topology import Layout, Node, PDSide, SlurmConfig, SSHConfig
from pytest_kimi.config.yamlfile import Located, read_yaml


def load_cluster(path: Path | str, environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """Read and validate a cluster file; any problem is a :class:`ConfigError`.

    ``environ`` (default: this process's environment) supplies the ``${NAME}`` references
    in string values (:mod:`~pytest_kimi.config.variables`) and the values of the variables
    named in ``env_from_local``; a missing one is an error naming it and the field."""
    path = Path(path)
    environ = os.environ if environ is None else environ
    src, used = variables.expand(read_yaml(path), environ, models.ClusterFile)
    try:
        raw = models.ClusterFile.model_validate(src.data)
    except ValidationError as exc:
        raise config_error(src, exc, models.ClusterFile) from None
    checks.check_cluster(src, raw)
    checks.check_processes(src, raw)
    return replace(_cluster(src, raw, environ), variables=used)


def _cluster(src: Located, raw: models.ClusterFile, environ: Mapping[str, str]) -> ClusterConfig:
    """The records, with the values other modules parse checked and parsed here, once."""
    nodes = tuple(_node(n, raw.ssh) for n in raw.nodes)
    layouts = {name: _layout(src, name, layout, raw.executor)
               for name, layout in raw.layouts.items()}  # fmt: skip
    confidence = checks.check_slos(src, "slo", raw.slo)
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
        server=_server(raw.server, _secret_env(src, "server", raw.server, environ)),
        router=_router(raw.router, nodes, _secret_env(src, "router", raw.router, environ)),
        workload=_workload(src, raw.workload),
        workloads={n: _named(src, n, raw.workload, w) for n, w in raw.workloads.items()},
        slo={name: value for name, value in raw.slo.items() if name != "confidence"},
        slo_confidence=confidence,
        mock=mock,
        startup_timeout_s=raw.startup_timeout_s,
        deployment_max_s=raw.deployment_max_s,
        history=_beside(src.path, raw.history) if raw.history else None,
        source=src,
        work_dir=raw.work_dir,
        regression=dict(raw.regression),
        regression_thresholds=checks.regression_thresholds(src, raw.regression),
        telemetry=TelemetryConfig(raw.telemetry.enabled, raw.telemetry.interval_s),
        preflight=PreflightConfig(raw.preflight.enabled, raw.preflight.busy_memory_mib),
        watchdog=WatchdogConfig(raw.watchdog.enabled, raw.watchdog.interval_s, raw.watchdog.misses),
        locks=LockConfig(raw.locks.enabled, raw.locks.dir or ""),
        nvidia_smi=tuple(raw.nvidia_smi),
        network=NetworkConfig(
            raw.network.interface,
            raw.network.preflight,
            raw.network.probe_timeout_s,
            raw.network.client,
            raw.network.client_node or raw.router.node or raw.nodes[0].name,
            tuple(raw.network.client_python) or (_python(raw.server.python),),
        ),
        startup_stall_s=raw.startup_stall_s,
        startup_report_s=raw.startup_report_s,
        logs=LogsConfig(raw.logs.max_mib, raw.logs.keep_runs, tail_report_s=raw.logs.tail_report_s),
        slurm=_slurm(raw.slurm, raw.startup_timeout_s),
    )


def _slurm(raw: nodemodels.Slurm | None, startup_timeout_s: float) -> SlurmConfig:
    if raw is None:
        return SlurmConfig(queue_timeout_s=startup_timeout_s)
    return SlurmConfig(
        partition=raw.partition, account=raw.account, time=raw.time, gres=raw.gres,
        gpus_per_node=raw.gpus_per_node, constraint=raw.constraint, reservation=raw.reservation,
        exclusive=raw.exclusive, job_name=raw.job_name, salloc_args=tuple(raw.salloc_args),
        srun_args=tuple(raw.srun_args), router=raw.router,
        queue_timeout_s=raw.queue_timeout_s or startup_timeout_s,
    )  # fmt: skip


def _node(node: nodemodels.NodeModel, defaults: nodemodels.SSH) -> Node:
    """A node's SSH settings: the cluster's defaults, overridden by what the node sets."""
    own = node.ssh.model_dump(include=node.ssh.model_fields_set)
    ssh = SSHConfig(**{**defaults.model_dump(), **own})
    return Node(
        name=node.name, host=node.host, gpus=node.gpus, ssh=ssh, env=dict(node.env), addr=node.addr
    )


def _layout(src: Located, name: str, layout: layoutmodels.LayoutModel, executor: str) -> Layout:
    if "confidence" in layout.slo:
        raise src.error(
            f"layouts.{name}.slo.confidence",
            "a confidence is the whole run's (slo.confidence), not one layout's",
        )
    checks.check_slos(src, f"layouts.{name}.slo", layout.slo)
    bootstrap_default = SGLANG_BOOTSTRAP_PORT if executor in ("ssh", "slurm") else "auto"
    sides = tuple(
        PDSide(role, side.tp, side.pp, side.ep, side.replicas, side.nodes_per_replica,
               args=tuple(side.args.items()), env=tuple(side.env.items()), policy=side.policy,
               bootstrap_port=_port(side.bootstrap_port or bootstrap_default))
        for role, side in (("prefill", layout.prefill), ("decode", layout.decode))
        if side is not None
    )  # fmt: skip
    unified = (layout.tp, layout.pp, layout.ep) if not sides else (0, 0, 0)
    return Layout(
        name, *unified, tuple(layout.slo.items()),
        args=tuple(layout.args.items()),
        env=tuple(layout.env.items()),
        nodes=tuple(layout.nodes or ()),
        replicas=layout.replicas,
        nodes_per_replica=layout.nodes_per_replica,
        router_node=layout.router.node,
        router_policy=layout.router.policy,
        default=layout.default,
        router_args=tuple(layout.router.args.items()),
        sides=sides,
        transfer_backend=layout.transfer_backend,
    )  # fmt: skip


SGLANG_BOOTSTRAP_PORT = 8998  # 0.5.9's --disaggregation-bootstrap-port default


def _python(value: str) -> str:
    """``current`` means the interpreter running pytest (local clusters)."""
    return sys.executable if value == "current" else value


def _port(value: int | str) -> int | None:
    return None if value == "auto" else int(value)


def _secret_env(
    src: Located,
    field: str,
    raw: processmodels.Server | processmodels.Router,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """The values of ``env_from_local``, read here once: they go nowhere but the nodes."""
    out = {}
    for i, name in enumerate(raw.env_from_local):
        if name not in environ:
            raise src.error(
                f"{field}.env_from_local[{i}]",
                f"{name} is not set in the environment of the machine running pytest "
                "(export it there, or remove it from the list)",
            )
        out[name] = environ[name]
    return out


def _container(raw: processmodels.Container | None) -> ContainerConfig | None:
    if raw is None:
        return None
    gpus = raw.gpus if isinstance(raw.gpus, str) else tuple(raw.gpus)
    return ContainerConfig(
        runtime=raw.runtime,
        mode=raw.mode,
        name=raw.name,
        image=raw.image,
        mounts=tuple(raw.mounts),
        gpus=gpus,
        args=tuple(raw.args),
        executable=raw.executable,
    )


def _server(server: processmodels.Server, secret_env: dict[str, str]) -> ServerConfig:
    return ServerConfig(
        python=_python(server.python),
        module=server.module,
        model_path=server.model_path,
        wrapper=tuple(server.wrapper),
        port=_port(server.port),
        dist_init_port=_port(server.dist_init_port),
        args=dict(server.args),
        env=dict(server.env),
        env_from_local=tuple(server.env_from_local),
        secret_env=secret_env,
        setup=tuple(server.setup),
        container=_container(server.container),
        sglang_version=server.sglang_version,
    )


def _router(
    router: processmodels.Router, nodes: tuple[Node, ...], secret_env: dict[str, str]
) -> RouterConfig:
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
        env_from_local=tuple(router.env_from_local),
        secret_env=secret_env,
        setup=tuple(router.setup),
        container=_container(router.container),
        allow_unknown_version=router.allow_unknown_version,
        package=router.package,
    )


def _workload(src: Located, workload: workloadmodels.Workload) -> WorkloadConfig:
    """The workload; a setting given as a list is swept: its first value is the workload's, all
    of them are its ``sweeps`` (:mod:`pytest_kimi.config.points`)."""
    goodput = workload.goodput.model_dump(exclude_none=True)
    sweeps = {
        name: tuple(value) for name in SWEPT if isinstance(value := getattr(workload, name), list)
    }
    if "request_rate" in sweeps:
        sweeps["request_rate"] = tuple(float(rate) for rate in sweeps["request_rate"])

    def first(name: str) -> Any:
        value = getattr(workload, name)
        return value[0] if isinstance(value, list) else value

    return WorkloadConfig(
        dataset=workload.dataset,
        num_requests=first("num_requests"),
        input_len=first("input_len"),
        output_len=first("output_len"),
        concurrency=first("concurrency"),
        warmup_requests=workload.warmup_requests,
        api=first("api"),
        seed=workload.seed,
        category=first("category"),
        request_timeout_s=workload.request_timeout_s,
        request_rate=float(first("request_rate")),
        percentiles=tuple(workload.percentiles),
        goodput=goodput,
        goodput_ms=checks.goodput_ms(src, goodput),
        speedbench_config=workload.speedbench_config,
        prompt=workload.prompt,
        clock_start=workload.clock_start,
        sweeps=sweeps,
    )


_SESSION_FIELDS = {"kind", "turns", "system_prompt_tokens", "task_tokens", "tool_result_tokens",
                   "think_time", "trace_speed", "arrivals"}  # fmt: skip


def _named(
    src: Located, name: str, base: workloadmodels.Workload, entry: workloadmodels.NamedWorkload
) -> WorkloadConfig:
    """A named workload: the settings it gives over the file's ``workload``, and its kind."""
    given = entry.model_dump(exclude_unset=True, exclude=_SESSION_FIELDS)
    merged = base.model_copy(update={key: getattr(entry, key) for key in given})
    return replace(
        _workload(src, merged), name=name, kind=entry.kind, turns=entry.turns,
        system_prompt_tokens=entry.system_prompt_tokens, task_tokens=entry.task_tokens,
        tool_result_tokens=entry.tool_result_tokens, think_time_s=entry.think_time.seconds,
        think_time_kind=entry.think_time.kind, trace_speed=entry.trace_speed,
        arrivals=_arrivals(src, name, merged, entry),
    )  # fmt: skip


def _arrivals(
    src: Located, name: str, merged: workloadmodels.Workload, entry: workloadmodels.NamedWorkload
) -> Path | None:
    """A named workload's recorded arrival list, beside the cluster file: it times single
    requests or sessions, and replaces request_rate's Poisson arrivals."""
    if entry.arrivals is None:
        return None
    where = f"workloads.{name}.arrivals"
    if entry.kind == "trace":
        raise src.error(where, "a trace brings its own timestamps; arrivals times requests, "
                               "sessions or agentic workloads")  # fmt: skip
    rates = merged.request_rate if isinstance(merged.request_rate, list) else [merged.request_rate]
    if any(float(rate) != float("inf") for rate in rates):
        raise src.error(where, "replaces request_rate's Poisson arrivals: leave request_rate "
                               "at inf")  # fmt: skip
    return _beside(src.path, entry.arrivals)


def _beside(cluster_file: Path, given: str) -> Path:
    """A path from the cluster file: ``~`` expanded, relative to the file's folder."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else cluster_file.parent / path
