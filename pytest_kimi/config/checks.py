"""Checks of the cluster file that one field's type cannot express.

Cross-field rules (TP x PP fills a replica, ports that would collide, ...) and the values
whose grammar belongs to another module (SLOs, goodput durations, regression thresholds, the
mock profile) are checked here, right after the models, so every problem with the file is a
``file:line: field: problem`` error before anything starts. The parsers are imported inside
the functions: they pull in numpy and the metrics, which the config must not need to import.
Each layout's own rules, and the flags pytest-kimi manages, are in
:mod:`~pytest_kimi.config.layoutchecks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pytest_kimi.config.layoutchecks import (
    ROUTER_MANAGED,
    SERVER_MANAGED,
    check_layout,
    check_managed,
)
from pytest_kimi.config.models import ClusterFile
from pytest_kimi.config.yamlfile import Located

T = TypeVar("T")
MOCK_MODULE = "pytest_kimi.mock.launch_server"  # the embedded mock (deploy.plan reads it here)
FIXED_PORTS = ("server.port", "server.dist_init_port", "router.port", "router.prometheus_port")


def check_cluster(src: Located, raw: ClusterFile) -> None:
    """Every cross-field rule, in the order a reader meets the fields."""
    names: set[str] = set()
    for i, node in enumerate(raw.nodes):
        if node.name in names:
            raise src.error(f"nodes[{i}].name", f"duplicate node name {node.name!r}")
        names.add(node.name)
    _replica_gpus(src, raw)  # the default deployment fits the nodes
    check_managed(src, "server.args", raw.server.args, SERVER_MANAGED)
    check_managed(src, "router.args", raw.router.args, ROUTER_MANAGED)
    _check_sglang_version(src, raw)
    _check_router_package(src, raw)
    for name, layout in raw.layouts.items():
        check_layout(src, raw, name, layout, names)
    if raw.router.node is not None and raw.router.node not in names:
        raise src.error("router.node", f"{raw.router.node!r} is not one of the nodes")
    _check_client(src, raw, names)
    ports = _ports(raw)
    if raw.executor in ("ssh", "slurm"):
        article = "an" if raw.executor == "ssh" else "a"
        fixed = f"{article} {raw.executor} cluster needs fixed ports, not 'auto'"
        for field in FIXED_PORTS:
            if ports[field] is None:
                raise src.error(field, fixed)
        for name, layout in raw.layouts.items():
            if layout.prefill is not None and layout.prefill.bootstrap_port == "auto":
                raise src.error(f"layouts.{name}.prefill.bootstrap_port", fixed)
    _check_distinct_ports(src, raw, ports)
    _check_slurm(src, raw)


def _check_router_package(src: Located, raw: ClusterFile) -> None:
    """``router.module`` of one router package under ``router.package`` of the other."""
    from pytest_kimi.config.versions import package_of_module

    named = package_of_module(raw.router.module)
    if raw.router.package != "auto" and named not in (None, raw.router.package):
        raise src.error(
            "router.module",
            f"{raw.router.module} is {named}'s launcher, but router.package is "
            f"{raw.router.package}: leave module out (the package's launcher is used) or make "
            "them agree",
        )


def _check_sglang_version(src: Located, raw: ClusterFile) -> None:
    """``server.sglang_version`` is a supported release, and one the mock answers as when the
    servers are the mock."""
    from pytest_kimi.config.versions import VersionError, mock_version, sglang_profile

    version = raw.server.sglang_version
    if version is None:
        return
    try:
        sglang_profile(version, "server.sglang_version")
    except VersionError as exc:
        raise src.error("server.sglang_version", str(exc)) from None
    problem = mock_version(version) if raw.server.module == MOCK_MODULE else None
    if problem:
        raise src.error("server.sglang_version", problem)


def _check_slurm(src: Located, raw: ClusterFile) -> None:
    """``slurm:`` belongs to ``executor: slurm``; what a Slurm cluster cannot do here."""
    if raw.executor != "slurm":
        if raw.slurm is not None:
            raise src.error("slurm", "only used with executor: slurm")
        return
    if raw.network.client != "direct":
        raise src.error("network.client", "executor: slurm runs the benchmark client here "
                        "(the submit host), not on a node or through SSH forwards")  # fmt: skip


def _check_client(src: Located, raw: ClusterFile, names: set[str]) -> None:
    """``network.client_node`` / ``client_python`` belong to ``client: on_node``, which needs
    a Python outside the servers' container."""
    net = raw.network
    if net.client != "on_node":
        for field in ("client_node", "client_python"):
            if field in net.model_fields_set:
                raise src.error(f"network.{field}", "only used with network.client: on_node")
        return
    if net.client_node is not None and net.client_node not in names:
        raise src.error("network.client_node", f"{net.client_node!r} is not one of the nodes")
    if raw.server.container is not None and not net.client_python:
        raise src.error(
            "network.client_python",
            "the servers run in a container, but the on_node client runs on the node itself: "
            "give the Python there that has httpx and orjson",
        )


RUNTIMES = ("docker", "podman", "apptainer", "singularity")


def check_processes(src: Located, raw: ClusterFile) -> None:
    """``env_from_local``, ``wrapper`` and ``container`` of the server and the router."""
    for field, proc in (("server", raw.server), ("router", raw.router)):
        envs = [(f"{field}.env", proc.env)]
        if field == "server":
            envs += [(f"nodes[{i}].env", node.env) for i, node in enumerate(raw.nodes)]
        for i, name in enumerate(proc.env_from_local):
            for where, env in envs:
                if name in env:
                    raise src.error(
                        f"{field}.env_from_local[{i}]",
                        f"{name} is also set in {where}: give it in one place only",
                    )
        wrapper = proc.wrapper
        runtime = len(wrapper) >= 2 and wrapper[0].rsplit("/", 1)[-1] in RUNTIMES
        if runtime and wrapper[1] in ("exec", "run", "instance"):
            raise src.error(
                f"{field}.wrapper",
                f"a container runtime as a wrapper ({' '.join(wrapper[:2])} ...) leaves the "
                "server running at teardown and its environment outside the container; use "
                f"{field}.container (docs/containers.md)",
            )
        if proc.container is not None:
            _check_container(src, raw, f"{field}.container", proc.container)


def _check_container(src: Located, raw: ClusterFile, field: str, box: Any) -> None:
    if raw.executor != "ssh":
        raise src.error(field, f"containers need executor: ssh (executor: {raw.executor} "
                        "runs no container runtime)")  # fmt: skip
    if box.mode == "exec":
        if box.name is None:
            raise src.error(field, "mode exec needs 'name': the running container to exec into")
        given = sorted({"image", "mounts", "gpus", "args"} & box.model_fields_set)
        if given:
            raise src.error(
                f"{field}.{given[0]}", "only for mode run (the container exists already)"
            )
    elif box.image is None:
        raise src.error(field, "mode run needs 'image'")


def _replica_gpus(src: Located, raw: ClusterFile) -> int:
    """GPUs of one replica; the deployment must fit the nodes, which must be alike."""
    dep = raw.deployment
    needed = dep.replicas * dep.nodes_per_replica
    if needed > len(raw.nodes):
        raise src.error(
            "deployment.nodes_per_replica",
            f"{dep.replicas} replicas x {dep.nodes_per_replica} nodes need {needed} nodes, "
            f"but 'nodes' lists {len(raw.nodes)}",
        )
    gpus = {node.gpus for node in raw.nodes[:needed]}
    if len(gpus) != 1:
        raise src.error("nodes", "all nodes of the deployment must have the same 'gpus'")
    return dep.nodes_per_replica * gpus.pop()


def _ports(raw: ClusterFile) -> dict[str, int | None]:
    values = (raw.server.port, raw.server.dist_init_port)
    values += (raw.router.port, raw.router.prometheus_port)
    return {f: None if v == "auto" else int(v) for f, v in zip(FIXED_PORTS, values, strict=True)}


def _check_distinct_ports(src: Located, raw: ClusterFile, ports: dict[str, int | None]) -> None:
    """Fixed ports that would collide on one host are a usage error, not a bind failure later."""
    hosts = {node.name: node.host for node in raw.nodes}
    router_node = raw.router.node or raw.nodes[0].name
    fields = list(FIXED_PORTS[:2])
    if hosts.get(router_node) in set(hosts.values()):  # the router shares a host with servers
        fields += FIXED_PORTS[2:]
    seen: dict[int, str] = {}
    for field in fields:
        port = ports[field]
        if port is None:
            continue
        if port in seen:
            raise src.error(field, f"port {port} is also {seen[port]}: they would collide")
        seen[port] = field
    for name, layout in raw.layouts.items():  # a prefill head's bootstrap server, beside them
        port = layout.prefill.bootstrap_port if layout.prefill is not None else None
        field = f"layouts.{name}.prefill.bootstrap_port"
        if isinstance(port, int) and port in seen:
            raise src.error(field, f"port {port} is also {seen[port]}: they would collide")
    if ports["server.port"] is not None:
        by_host: dict[str, str] = {}
        for node in raw.nodes:
            if node.host in by_host:
                raise src.error(
                    "server.port",
                    f"nodes {by_host[node.host]} and {node.name} share host {node.host}: one "
                    f"fixed port {ports['server.port']} would collide; use 'auto' or distinct "
                    "hosts",
                )
            by_host[node.host] = node.name


def parsed(src: Located, field: str, parse: Callable[[str], T]) -> T:
    """``parse(source)`` with ``source`` = the field; its ``ValueError`` names file and line.

    The SLO and baseline parsers start their messages with the source they were given; that
    prefix is dropped since the field is already in the ``file:line: field`` part."""
    try:
        return parse(field)
    except ValueError as exc:
        text = str(exc)
        raise src.error(field, text.removeprefix(f"{field}: ")) from None


def goodput_ms(src: Located, goodput: Mapping[str, str]) -> dict[str, float]:
    """``workload.goodput`` limits in milliseconds, parsed once."""
    from pytest_kimi.results.slo import parse_duration_ms

    return {
        key: parsed(src, f"workload.goodput.{key}", lambda s, v=value: parse_duration_ms(v, s))
        for key, value in goodput.items()
    }


def check_slos(src: Located, prefix: str, slos: Mapping[str, str]) -> float | None:
    """Each ``slo:`` entry parses (kept as text: the session merges them with CLI ones); the
    ``confidence`` entry (not a metric) is returned parsed, None where there is none."""
    from pytest_kimi.results.slo import parse_confidence, parse_slo

    for name, value in slos.items():
        if name == "confidence":
            continue
        parsed(src, f"{prefix}.{name}", lambda s, n=name, v=value: parse_slo(n, v, s))
    if "confidence" not in slos:
        return None
    return parsed(src, f"{prefix}.confidence",
                  lambda s: parse_confidence(slos["confidence"], s))  # fmt: skip


def regression_thresholds(src: Located, regression: Mapping[str, str]) -> dict[str, float]:
    """``regression:`` thresholds as fractions (``10%`` -> 0.1), one metric per entry."""
    from pytest_kimi.results.baselinefile import parse_thresholds

    out: dict[str, float] = {}
    for name, value in regression.items():
        field = f"regression.{name}"
        one = parsed(src, field, lambda s, n=name, v=value: parse_thresholds(f"{n}:{v}", s))
        if list(one) != [name]:
            raise src.error(field, f"expected one threshold such as 10% or 0.1, got {value!r}")
        out[name] = one[name]
    return out


def check_profile(src: Located, profile: Mapping[str, Any]) -> None:
    """The mock's performance profile builds (numbers, known keys), as the mock will build it."""
    from pytest_kimi.config.profile import Profile

    try:
        Profile.from_mapping(profile)
    except ValueError as exc:
        key, _, problem = str(exc).partition(": ")
        raise src.error(f"mock.profile.{key}", problem or str(exc)) from None
