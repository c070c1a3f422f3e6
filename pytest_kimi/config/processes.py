"""How each process is started, as frozen records: the servers, the router, the mock.

Built by :func:`pytest_kimi.config.load_cluster` from :mod:`~pytest_kimi.config.processmodels`
with the defaults resolved (``python: current``, ``auto`` ports, the router's node); the
values of ``env_from_local`` are kept apart (``secret_env``, out of every repr).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ContainerConfig:
    """Where a process runs inside a container (docs/containers.md)."""

    runtime: str  # docker | podman | apptainer | singularity
    mode: str  # exec: into a running container; run: start one from ``image``
    name: str | None  # exec: the running container; run: None = kimi-<run>-<proc>
    image: str | None = None  # run mode
    mounts: tuple[str, ...] = ()  # run mode: SRC:DST[:ro]
    gpus: str | tuple[int, ...] = "all"  # run mode: all | none | GPU indexes
    args: tuple[str, ...] = ()  # run mode: extra runtime flags
    executable: str | None = None  # the runtime's CLI on the nodes; None = the runtime's name

    @property
    def cli(self) -> str:
        return self.executable or self.runtime


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
    env_from_local: tuple[str, ...] = ()  # names copied from the pytest machine's environment
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)  # their values
    setup: tuple[str, ...] = ()  # shell lines run before the command, in the same shell
    container: ContainerConfig | None = None
    sglang_version: str | None = None  # None: the newest profile (pytest_kimi.config.versions)
    sglang_version_from: str = "server.sglang_version"  # or --kimi-sglang-version


@dataclass(frozen=True)
class RouterConfig:
    """How to start the SGLang Router in front of the replicas."""

    python: str
    module: str | None  # None: the package's launcher (pytest_kimi.config.versions.RouterPackage)
    node: str
    port: int | None
    prometheus_port: int | None
    policy: str
    args: Mapping[str, str | int | float | bool]
    env: Mapping[str, str]
    wrapper: tuple[str, ...] = ()
    model_mount: str | None = None  # the model dir the router reads its tokenizer from
    env_from_local: tuple[str, ...] = ()  # names copied from the pytest machine's environment
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)  # their values
    setup: tuple[str, ...] = ()  # shell lines run before the command, in the same shell
    container: ContainerConfig | None = None
    allow_unknown_version: bool = False  # start a router outside its supported range (a note)
    package: str = "auto"  # smg, sglang-router, or auto: the router node's, smg first


@dataclass(frozen=True)
class MockConfig:
    """Embedded mock backend settings: time scale, seed, performance profile (the SGLang
    version it answers as is ``server.sglang_version``)."""

    time_scale: float
    seed: int
    profile: Mapping[str, Any]
