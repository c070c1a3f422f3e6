"""Typed, validated cluster configuration (``clusters/*.yaml``).

One YAML file describes a cluster (nodes, how to start SGLang and the router), the layouts it
can run, the workload and the SLOs. Every problem is a :class:`ConfigError` that names the
file, the line and the field, raised before anything is started.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimi.yamlfile import ConfigError, Located, read_yaml

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "Layout",
    "MockConfig",
    "Node",
    "RouterConfig",
    "SSHConfig",
    "ServerConfig",
    "WorkloadConfig",
    "load_cluster",
]

AUTO = "auto"
APIS = ("generate", "completions", "chat")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SSHConfig:
    """How to reach a node over SSH. Secrets are never values here, only where to find them."""

    user: str = "root"
    port: int = 22
    key: str | None = None  # private key file
    passphrase_env: str | None = None  # NAME of the environment variable holding its passphrase
    known_hosts: str | None = None  # default: ~/.ssh/known_hosts
    check_host_keys: bool = True
    jump_host: str | None = None  # [user@]host[:port]
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 120.0


@dataclass(frozen=True)
class Node:
    """One machine of the cluster (a local process group on the mock)."""

    name: str
    host: str
    gpus: int
    ssh: SSHConfig = field(default_factory=SSHConfig)
    env: Mapping[str, str] = field(default_factory=dict)  # this node's extra server environment


@dataclass(frozen=True)
class Layout:
    """A parallel layout of one replica: tensor, pipeline and expert parallel sizes."""

    name: str
    tp: int
    pp: int
    ep: int
    slo: tuple[tuple[str, str], ...] = ()  # SLOs for this layout only (override the cluster's)

    @property
    def label(self) -> str:
        return f"TP{self.tp}/PP{self.pp}/EP{self.ep}"


@dataclass(frozen=True)
class ServerConfig:
    """How to start one SGLang server process on a node."""

    python: str
    module: str
    model_path: str
    wrapper: tuple[str, ...]  # argv put before python, e.g. a container: [docker, exec, sglang]
    port: int | None  # None: pick a free port at bring-up (local only)
    dist_init_port: int | None
    args: Mapping[str, str | int | float | bool]
    env: Mapping[str, str]


@dataclass(frozen=True)
class RouterConfig:
    """How to start the SGLang Router in front of the replicas."""

    python: str
    module: str
    node: str
    port: int | None
    prometheus_port: int | None
    policy: str
    args: Mapping[str, str | int | float | bool]
    env: Mapping[str, str]
    wrapper: tuple[str, ...] = ()
    model_mount: str | None = None  # the model dir the router reads its tokenizer from


@dataclass(frozen=True)
class WorkloadConfig:
    """The benchmark workload: SPEED-Bench rows, lengths, concurrency."""

    dataset: str
    num_requests: int
    input_len: int
    output_len: int
    concurrency: int
    warmup_requests: int
    api: str
    seed: int
    category: str | None
    request_timeout_s: float
    request_rate: float  # requests/s; inf sends as fast as concurrency allows
    percentiles: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
    goodput: Mapping[str, str] = field(default_factory=dict)  # per-request limits: ttft/tpot/e2e


@dataclass(frozen=True)
class MockConfig:
    """Embedded mock backend settings: time scale, seed and performance profile."""

    time_scale: float
    seed: int
    profile: Mapping[str, Any]


@dataclass(frozen=True)
class ClusterConfig:
    """A whole cluster file, validated."""

    path: Path
    name: str
    executor: str
    nodes: tuple[Node, ...]
    replicas: int
    nodes_per_replica: int
    layouts: Mapping[str, Layout]
    server: ServerConfig
    router: RouterConfig
    workload: WorkloadConfig
    slo: Mapping[str, str]
    mock: MockConfig | None
    startup_timeout_s: float
    source: Located = field(repr=False, compare=False)
    work_dir: str = "/tmp/pytest-kimi"  # on each node: logs and exit codes of our processes
    regression: Mapping[str, str] = field(default_factory=dict)  # gate thresholds, e.g. 10%

    @property
    def time_scale(self) -> float:
        """Cluster seconds per wall second: 1 on a real cluster."""
        return self.mock.time_scale if self.mock else 1.0

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def layout(self, name: str) -> Layout:
        """The layout called ``name``; a clear error lists the known ones."""
        try:
            return self.layouts[name]
        except KeyError:
            known = ", ".join(self.layouts)
            raise self.source.error(
                "layouts", f"unknown layout {name!r}; this cluster defines: {known}"
            ) from None

    def replica_nodes(self, replica: int) -> tuple[Node, ...]:
        start = replica * self.nodes_per_replica
        return self.nodes[start : start + self.nodes_per_replica]


class _Fields:
    """Typed access to one YAML mapping; remembers which keys were read."""

    def __init__(self, src: Located, data: Any, prefix: str) -> None:
        if not isinstance(data, dict):
            raise src.error(prefix or "(top level)", f"expected a mapping, got {_kind(data)}")
        self.src, self.data, self.prefix, self.seen = src, data, prefix, set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, problem: str) -> ConfigError:
        return self.src.error(self._name(key), problem)

    def raw(self, key: str, default: Any = ...) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is ...:
                raise self.src.error(self._name(key), "required field is missing")
            return default
        return self.data[key]

    def str(self, key: str, default: Any = ..., choices: tuple[str, ...] = ()) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {_kind(value)}")
        if choices and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def int(self, key: str, default: Any = ..., minimum: int = 0) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {_kind(value)}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: Any = ..., positive: bool = True) -> Any:
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {_kind(value)}")
        if positive and not value > 0:
            raise self.error(key, f"must be > 0, got {value}")
        return float(value)

    def port(self, key: str, default: Any = AUTO) -> int | None:
        value = self.raw(key, default)
        if value == AUTO:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise self.error(key, f"expected a port 1-65535 or 'auto', got {value!r}")
        return value

    def bool(self, key: str, default: Any = ...) -> Any:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_kind(value)}")
        return value

    def argv(self, key: str) -> tuple[str, ...]:
        value = self.raw(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(key, "expected a list of command-line words, e.g. [docker, exec, c]")
        return tuple(value)

    def sub(self, key: str, default: Any = ...) -> _Fields:
        return _Fields(self.src, self.raw(key, default), self._name(key))

    def flags(self, key: str) -> dict[str, str | int | float | bool]:
        """A mapping of command-line flags (``flag-name: value``) without leading dashes."""
        sub = self.sub(key, {})
        out: dict[str, str | int | float | bool] = {}
        for name, value in sub.data.items():
            sub.seen.add(name)
            if not isinstance(name, str) or not _FLAG.match(name):
                raise sub.error(str(name), "flag names are lowercase words joined by '-'")
            if not isinstance(value, str | int | float | bool):
                raise sub.error(name, f"expected a scalar value, got {_kind(value)}")
            out[name] = value
        return out

    def strings(self, key: str, names: re.Pattern[str] | None = None) -> dict[str, str]:
        sub = self.sub(key, {})
        out: dict[str, str] = {}
        for name, value in sub.data.items():
            sub.seen.add(name)
            if names is not None and not names.match(str(name)):
                raise sub.error(str(name), "not a valid environment variable name")
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise sub.error(str(name), f"expected a string, got {_kind(value)}")
            out[str(name)] = str(value)
        return out

    def done(self) -> None:
        """Reject keys nobody read: a typo must not be silently ignored."""
        for key in self.data:
            if key not in self.seen:
                known = ", ".join(sorted(self.seen))
                raise self.error(str(key), f"unknown field (known fields here: {known})")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


def load_cluster(path: Path | str) -> ClusterConfig:
    """Read and validate a cluster file."""
    path = Path(path)
    src = read_yaml(path)
    top = _Fields(src, src.data, "")
    name = top.str("name")
    executor = top.str("executor", "local", choices=("local", "ssh"))
    defaults = _ssh(top.sub("ssh", {}), SSHConfig())
    nodes = _nodes(top, defaults)
    work_dir = top.str("work_dir", "/tmp/pytest-kimi")
    dep = top.sub("deployment")
    replicas = dep.int("replicas", minimum=1)
    per_replica = dep.int("nodes_per_replica", minimum=1)
    dep.done()
    needed = replicas * per_replica
    if needed > len(nodes):
        raise dep.error(
            "nodes_per_replica",
            f"{replicas} replicas x {per_replica} nodes need {needed} nodes, "
            f"but 'nodes' lists {len(nodes)}",
        )
    gpus = {n.gpus for n in nodes[:needed]}
    if len(gpus) != 1:
        raise src.error("nodes", "all nodes of the deployment must have the same 'gpus'")
    replica_gpus = per_replica * gpus.pop()

    layouts = _layouts(top, replica_gpus)
    server = _server(top.sub("server"), path)
    router = _router(top.sub("router"), nodes)
    workload = _workload(top.sub("workload"))
    slo = top.strings("slo")
    regression = top.strings("regression")
    mock = _mock(top.sub("mock")) if "mock" in top.data else None
    if mock is None:
        top.seen.add("mock")
    startup = top.number("startup_timeout_s", 900.0)
    top.done()
    if executor == "ssh":
        fixed = {
            "server.port": server.port,
            "server.dist_init_port": server.dist_init_port,
            "router.port": router.port,
            "router.prometheus_port": router.prometheus_port,
        }
        for field_name, value in fixed.items():
            if value is None:
                raise src.error(field_name, "an ssh cluster needs fixed ports, not 'auto'")
    _check_distinct_ports(src, server, router, nodes)
    return ClusterConfig(
        path=path,
        name=name,
        executor=executor,
        nodes=nodes,
        replicas=replicas,
        nodes_per_replica=per_replica,
        layouts=layouts,
        server=server,
        router=router,
        workload=workload,
        slo=slo,
        mock=mock,
        startup_timeout_s=startup,
        source=src,
        work_dir=work_dir,
        regression=regression,
    )


def _check_distinct_ports(
    src: Located, server: ServerConfig, router: RouterConfig, nodes: tuple[Node, ...]
) -> None:
    """Fixed ports that would collide on one host are a usage error, not a bind failure later."""
    seen: dict[int, str] = {}
    fields = [("server.port", server.port), ("server.dist_init_port", server.dist_init_port)]
    hosts = {n.name: n.host for n in nodes}
    router_host_has_server = hosts.get(router.node) in {n.host for n in nodes}
    if router_host_has_server:
        fields += [("router.port", router.port), ("router.prometheus_port", router.prometheus_port)]
    for name, port in fields:
        if port is None:
            continue
        if port in seen:
            raise src.error(name, f"port {port} is also {seen[port]}: they would collide")
        seen[port] = name
    if server.port is not None:
        by_host: dict[str, str] = {}
        for node in nodes:
            if node.host in by_host:
                raise src.error(
                    "server.port",
                    f"nodes {by_host[node.host]} and {node.name} share host {node.host}: one "
                    f"fixed port {server.port} would collide; use 'auto' or distinct hosts",
                )
            by_host[node.host] = node.name


def _ssh(f: _Fields, base: SSHConfig) -> SSHConfig:
    """An ``ssh:`` block; missing fields come from ``base`` (the cluster-wide defaults)."""
    ssh = SSHConfig(
        user=f.str("user", base.user),
        port=f.int("port", base.port, minimum=1),
        key=f.str("key", base.key),
        passphrase_env=f.str("passphrase_env", base.passphrase_env),
        known_hosts=f.str("known_hosts", base.known_hosts),
        check_host_keys=f.bool("check_host_keys", base.check_host_keys),
        jump_host=f.str("jump_host", base.jump_host),
        connect_timeout_s=f.number("connect_timeout_s", base.connect_timeout_s),
        command_timeout_s=f.number("command_timeout_s", base.command_timeout_s),
    )
    f.done()
    if ssh.passphrase_env is not None and not _ENV_NAME.match(ssh.passphrase_env):
        raise f.error("passphrase_env", "the NAME of an environment variable, not a passphrase")
    return ssh


def _nodes(top: _Fields, defaults: SSHConfig) -> tuple[Node, ...]:
    raw = top.raw("nodes")
    if not isinstance(raw, list) or not raw:
        raise top.error("nodes", "expected a non-empty list of nodes")
    nodes = []
    for i, item in enumerate(raw):
        f = _Fields(top.src, item, f"nodes[{i}]")
        node = Node(
            name=f.str("name"),
            host=f.str("host"),
            gpus=f.int("gpus", minimum=1),
            ssh=_ssh(f.sub("ssh", {}), defaults),
            env=f.strings("env", _ENV_NAME),
        )
        f.done()
        if not _NAME.match(node.name):
            raise f.error("name", f"{node.name!r} is not a plain name (letters, digits, . _ -)")
        if node.name in {n.name for n in nodes}:
            raise f.error("name", f"duplicate node name {node.name!r}")
        nodes.append(node)
    return tuple(nodes)


def _layouts(top: _Fields, replica_gpus: int) -> dict[str, Layout]:
    section = top.sub("layouts")
    layouts: dict[str, Layout] = {}
    for name in section.data:
        f = section.sub(name)
        layout = Layout(
            name=str(name),
            tp=f.int("tp", minimum=1),
            pp=f.int("pp", 1, minimum=1),
            ep=f.int("ep", 1, minimum=1),
            slo=tuple(f.strings("slo").items()),
        )
        f.done()
        if not _NAME.match(layout.name):
            raise section.error(str(name), "layout names are plain words (letters, digits, . _ -)")
        if layout.tp * layout.pp != replica_gpus:
            raise f.error(
                "tp",
                f"TP x PP = {layout.tp} x {layout.pp} = {layout.tp * layout.pp}, but one replica "
                f"has {replica_gpus} GPUs (deployment.nodes_per_replica x nodes[].gpus)",
            )
        if layout.tp % layout.ep:
            raise f.error("ep", f"EP {layout.ep} must divide TP {layout.tp}")
        layouts[layout.name] = layout
    if not layouts:
        raise top.error("layouts", "define at least one layout")
    return layouts


def _python(value: str) -> str:
    """``current`` means the interpreter running pytest (local clusters)."""
    return sys.executable if value == "current" else value


def _server(f: _Fields, path: Path) -> ServerConfig:
    server = ServerConfig(
        python=_python(f.str("python", "python3")),
        module=f.str("module", "sglang.launch_server"),
        model_path=f.str("model_path"),
        wrapper=f.argv("wrapper"),
        port=f.port("port"),
        dist_init_port=f.port("dist_init_port"),
        args=f.flags("args"),
        env=f.strings("env", _ENV_NAME),
    )
    f.done()
    return server


def _router(f: _Fields, nodes: tuple[Node, ...]) -> RouterConfig:
    router = RouterConfig(
        python=_python(f.str("python", "python3")),
        module=f.str("module", "sglang_router.launch_router"),
        node=f.str("node", nodes[0].name),
        port=f.port("port"),
        prometheus_port=f.port("prometheus_port"),
        policy=f.str("policy", "round_robin"),
        args=f.flags("args"),
        env=f.strings("env", _ENV_NAME),
        wrapper=f.argv("wrapper"),
        model_mount=f.str("model_mount", None),
    )
    f.done()
    if router.node not in {n.name for n in nodes}:
        raise f.error("node", f"{router.node!r} is not one of the nodes")
    return router


def _workload(f: _Fields) -> WorkloadConfig:
    rate = f.raw("request_rate", "inf")
    if rate != "inf" and (isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0):
        raise f.error("request_rate", f"expected requests/s > 0 or 'inf', got {rate!r}")
    workload = WorkloadConfig(
        dataset=f.str("dataset"),
        num_requests=f.int("num_requests", minimum=1),
        input_len=f.int("input_len", minimum=1),
        output_len=f.int("output_len", minimum=1),
        concurrency=f.int("concurrency", minimum=1),
        warmup_requests=f.int("warmup_requests", 1),
        api=f.str("api", "generate", choices=APIS),
        seed=f.int("seed", 0),
        category=f.str("category", None),
        request_timeout_s=f.number("request_timeout_s", 3600.0),
        request_rate=float(rate),
        percentiles=_percentiles(f),
        goodput=f.strings("goodput"),
    )
    f.done()
    for key in workload.goodput:
        if key not in ("ttft", "tpot", "e2e"):
            raise f.error(f"goodput.{key}", "goodput limits are ttft, tpot and e2e")
    return workload


def _percentiles(f: _Fields) -> tuple[float, ...]:
    raw = f.raw("percentiles", [50, 90, 95, 99])
    if not isinstance(raw, list) or not raw:
        raise f.error("percentiles", "expected a list of percentiles, e.g. [50, 90, 95, 99]")
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
            raise f.error("percentiles", f"{value!r} is not a percentile in (0, 100]")
    return tuple(float(v) for v in raw)


def _mock(f: _Fields) -> MockConfig:
    profile = f.raw("profile", {})
    if not isinstance(profile, dict):
        raise f.error("profile", f"expected a mapping, got {_kind(profile)}")
    mock = MockConfig(
        time_scale=f.number("time_scale", 1.0),
        seed=f.int("seed", 0),
        profile=profile,
    )
    f.done()
    return mock
