"""Fixtures for conformance tests against peer tools: a venv with the real peer, a mock server.

The peer (``sglang.bench_serving`` from sglang 0.5.9) lives in its own venv so its pins
(transformers==4.57.1, ...) never touch the project's. ``KIMI_BENCH_SERVING_PYTHON`` names
the interpreter of an existing install; otherwise ``scripts/install_bench_serving.sh`` builds
``.venv-bench-serving`` at the repository root on first use (~1.5 min, ~700 MB; a no-op when
it is already there). A failed install fails the test with the reason: it is never skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kimi.deploy.plan import free_port
from pytest_kimi.testing.peer import (
    DEFAULT_VENV,
    INSTALL_SCRIPT,
    PYTHON_ENV_VAR,
    import_error,
    install,
    offline_env,
)
from pytest_kimi.testing.processes import Proc, mock_argv

INSTALL_TIMEOUT_S = 1200.0


@pytest.fixture(scope="session")
def peer_env() -> dict[str, str]:
    """The environment to run peer tools in (see :func:`offline_env`)."""
    return offline_env()


@pytest.fixture(scope="session")
def bench_serving_python() -> Path:
    """Interpreter of a venv with sglang 0.5.9's bench_serving; installs it when needed."""
    given = os.environ.get(PYTHON_ENV_VAR)
    if given:
        python = Path(given)
        error = import_error(python)
        if error is not None:
            pytest.fail(f"{PYTHON_ENV_VAR}={given} cannot import sglang.bench_serving:\n{error}")
        return python

    python = DEFAULT_VENV / "bin" / "python"
    try:
        code, output = install(DEFAULT_VENV, INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{INSTALL_SCRIPT.name} {DEFAULT_VENV} did not finish in {INSTALL_TIMEOUT_S:g}s"
        )
    if code != 0:
        pytest.fail(
            f"installing sglang.bench_serving failed ({INSTALL_SCRIPT.name} {DEFAULT_VENV}, "
            f"exit {code}); set {PYTHON_ENV_VAR} to use an existing install.\n{output[-4000:]}"
        )
    error = import_error(python)
    if error is not None:
        pytest.fail(f"{python} cannot import sglang.bench_serving after install:\n{error}")
    return python


class MockServer(Proc):
    """One ``pytest_kimi.mock.launch_server`` process (its own process group) and its URL."""

    def __init__(self, port: int, log: Path, *flags: str) -> None:
        super().__init__(mock_argv(port, *flags), log, env=offline_env())
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def start_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``start_mock(*flags)`` starts a mock server on a free loopback port; stopped at teardown."""
    servers: list[MockServer] = []

    def start(*flags: str) -> MockServer:
        log = tmp_path_factory.mktemp("mock") / "server.log"
        server = MockServer(free_port(), log, *flags)
        servers.append(server)
        server.wait_http(server.url + "/health")
        return server

    yield start
    for server in servers:
        server.stop()
