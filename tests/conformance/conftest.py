"""Fixtures for conformance tests against peer tools: a venv with the real peer, a mock server,
and (``wire_pair``) a real SGLang server of each version beside the mock speaking its wire.

The 0.5.9 peer (``sglang.bench_serving``) lives in its own venv so its pins
(transformers==4.57.1, ...) never touch the project's; 0.5.23's (``sglang.benchmark.serving``)
runs from the real 0.5.23 server's venv, which has its imports (torch among them).
``KIMI_BENCH_SERVING_PYTHON`` names the 0.5.9 interpreter of an existing install; otherwise
``scripts/install_bench_serving.sh`` builds ``.venv-bench-serving`` at the repository root on
first use (~1.5 min, ~700 MB; a no-op when it is already there). A failed install fails the
test with the reason: it is never skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.testing import realsglang
from pytest_kimi.testing.peer import (
    DEFAULT_VENV,
    INSTALL_SCRIPT,
    PYTHON_ENV_VAR,
    import_error,
    install,
    offline_env,
)
from pytest_kimi.testing.processes import Proc, mock_argv
from pytest_kimi.testing.wireprobe import Transcript, run_probe

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


@dataclass(frozen=True)
class WirePair:
    """One SGLang version's real server and the mock speaking its wire, each after the same
    probe (:func:`pytest_kimi.testing.wireprobe.run_probe`): their transcripts, and what the
    real server answers on the mock's own ``/kimi/...`` routes."""

    version: str
    real: Transcript
    mock: Transcript
    kimi_routes_on_real: dict[str, int]


MOCK_TIME_SCALE = "20"  # the mock's decode step a few wall milliseconds: a 3000-token request
# runs for seconds, long enough to abort, and the probe's 16-token ones are quick
KIMI_ROUTES = (("GET", "/kimi/ground_truth"), ("POST", "/kimi/faults"))


def _probe_both(version: str, real: realsglang.RealServer, mock: MockServer) -> WirePair:
    mock.wait_http(mock.url + "/health")
    real.wait_ready()
    info = httpx.get(real.url + "/get_server_info", timeout=60, trust_env=False).json()
    context = int(info["context_length"])
    real_t, mock_t = run_probe(real.url, context), run_probe(mock.url, context)
    kimi = {f"{method} {path}": httpx.request(method, real.url + path, json={}, timeout=60,
                                              trust_env=False).status_code
            for method, path in KIMI_ROUTES}  # fmt: skip
    return WirePair(version, real_t, mock_t, kimi)


@pytest.fixture(scope="module", params=realsglang.VERSIONS)
def wire_pair(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[WirePair]:  # fmt: skip
    """A real server of the version (its CPU venv, the tiny model) and the mock with
    ``--mock-sglang-version``, on the same flags and model path, started together; both
    probed once, then stopped (the real one's log checked for stand-in calls). Skips (or
    fails, where real SGLang is required) when the version cannot be installed."""
    version = request.param
    python = realsglang.install(version)
    logs = tmp_path_factory.mktemp(f"wire-{version}")
    flags = (*realsglang.CPU_FLAGS, *realsglang.CONFORMANCE_FLAGS)
    real = realsglang.RealServer(version, python, free_port(), logs / "real.log",
                                 *realsglang.CONFORMANCE_FLAGS)  # fmt: skip
    mock: MockServer | None = None
    try:
        mock = MockServer(free_port(), logs / "mock.log", "--model-path",
                          str(realsglang.MODEL_DIR), *flags, "--mock-sglang-version", version,
                          "--mock-time-scale", MOCK_TIME_SCALE)  # fmt: skip
        yield _probe_both(version, real, mock)
    finally:
        realsglang.stop_servers(mock, real)
