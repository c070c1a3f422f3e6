"""Tests against real SGLang servers (0.5.9 and 0.5.23) on the CPU, behind the real router:
each version behind the router its users ran it with (0.5.9: sglang-router 0.3.2, in its own
venv; 0.5.23: smg, the project's dependency), so both router generations meet real servers.

Each version's venv is built on first use by ``scripts/install_real_sglang.sh`` (CI builds
them beside its other installs). Where that cannot be done the tests skip with the reason;
``KIMI_REAL_SGLANG_REQUIRED=1`` (CI) makes it a failure instead: missing is never passing.
Tests are grouped by version (the ``sglang_version`` fixture is session-scoped), so each
version's servers start once per module that needs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pytest_kimi.config.versions import ROUTER_PACKAGES, RouterPackage
from pytest_kimi.deploy.ports import free_port
from pytest_kimi.testing.peer import offline_env
from pytest_kimi.testing.processes import Proc
from pytest_kimi.testing.realsglang import (
    ROUTER_OF,
    START_TIMEOUT_S,
    VERSIONS,
    RealServer,
    install,
    router_python,
    stop_servers,
)


@pytest.fixture(scope="session", params=VERSIONS)
def sglang_version(request: pytest.FixtureRequest) -> str:
    return request.param


@dataclass(frozen=True)
class RouterUnderTest:
    """The router package a version is held against, and the interpreter that has it."""

    package: RouterPackage
    python: Path
    version: str  # "": the project's own (its newest)


@pytest.fixture(scope="session")
def router(sglang_version: str) -> RouterUnderTest:
    package, version = ROUTER_OF[sglang_version]
    return RouterUnderTest(ROUTER_PACKAGES[package], router_python(package, version), version)


@pytest.fixture(scope="session")
def sglang_python(sglang_version: str) -> Path:
    """The venv's interpreter of this version (installed now if needed)."""
    return install(sglang_version)


@dataclass
class RealDeployment:
    """Two real SGLang servers behind the real SGLang Router (round robin)."""

    version: str
    servers: list[RealServer]
    router: Proc
    url: str
    metrics_url: str


def _router_argv(
    router: RouterUnderTest, workers: list[str], port: int, metrics_port: int
) -> list[str]:
    from pytest_kimi.config.serverargs import flags
    from pytest_kimi.config.versions import router_args

    return [
        str(router.python), "-m", router.package.module, "--worker-urls", *workers,
        "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        *flags(router_args(router.package, {}, router.version or None)),  # as pytest-kimi does
    ]  # fmt: skip


def _wait_router(router: Proc, url: str, workers: int) -> None:
    """Until the router's ``/readiness`` counts every worker healthy."""
    router.wait_http(url + "/readiness", timeout_s=60)
    ready = httpx.get(url + "/readiness", timeout=5, trust_env=False).json()
    assert ready.get("healthy_workers") == workers, ready


@pytest.fixture(scope="module")
def real_deployment(
    sglang_version: str,
    sglang_python: Path,
    router: RouterUnderTest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealDeployment]:
    """A deployment started by hand (not by pytest-kimi), for attaching to: both servers at
    once, then the router once they answer."""
    logs = tmp_path_factory.mktemp(f"real-{sglang_version}")
    servers: list[RealServer] = []
    proc: Proc | None = None
    try:
        for i in range(2):
            servers.append(RealServer(sglang_version, sglang_python, free_port(),
                                      logs / f"server{i}.log"))  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(START_TIMEOUT_S), servers))
        port, metrics_port = free_port(), free_port()
        url = f"http://127.0.0.1:{port}"
        proc = Proc(_router_argv(router, [s.url for s in servers], port, metrics_port),
                    logs / "router.log", env=offline_env())  # fmt: skip
        _wait_router(proc, url, len(servers))
        yield RealDeployment(sglang_version, servers, proc, url,
                             f"http://127.0.0.1:{metrics_port}/metrics")  # fmt: skip
    finally:
        stop_servers(proc, *servers)
