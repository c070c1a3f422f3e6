"""Fixtures for conformance tests against peer tools: a venv with the real peer, a mock server.

The peer (``sglang.bench_serving`` from sglang 0.5.9) lives in its own venv so its pins
(transformers==4.57.1, ...) never touch the project's. ``KIMI_BENCH_SERVING_PYTHON`` names
the interpreter of an existing install; otherwise ``scripts/install_bench_serving.sh`` builds
``.venv-bench-serving`` at the repository root on first use (~1.5 min, ~700 MB; a no-op when
it is already there). A failed install fails the test with the reason: it is never skipped.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_kimi.deploy.executor import group_alive
from pytest_kimi.deploy.plan import free_port
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install_bench_serving.sh"
DEFAULT_VENV = ROOT / ".venv-bench-serving"
PYTHON_ENV_VAR = "KIMI_BENCH_SERVING_PYTHON"
INSTALL_TIMEOUT_S = 1200.0


def offline_env() -> dict[str, str]:
    """Environment for peer processes: no model hub, no proxy between us and loopback."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _import_error(python: Path) -> str | None:
    """None when ``python`` imports sglang.bench_serving, else what went wrong."""
    try:
        done = subprocess.run(
            [str(python), "-c", "import sglang.bench_serving"],
            env=offline_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return None
    return (done.stderr or done.stdout).strip()[-3000:] or f"exit code {done.returncode}"


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
        error = _import_error(python)
        if error is not None:
            pytest.fail(f"{PYTHON_ENV_VAR}={given} cannot import sglang.bench_serving:\n{error}")
        return python

    python = DEFAULT_VENV / "bin" / "python"
    # One installer at a time (xdist workers, two checkouts' test runs): lock the script.
    with INSTALL_SCRIPT.open("rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(
                ["bash", str(INSTALL_SCRIPT), str(DEFAULT_VENV)],
                # pip may need the proxy settings that offline_env() strips
                env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=INSTALL_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{INSTALL_SCRIPT.name} {DEFAULT_VENV} did not finish in {INSTALL_TIMEOUT_S:g}s"
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if done.returncode != 0:
        pytest.fail(
            f"installing sglang.bench_serving failed ({INSTALL_SCRIPT.name} {DEFAULT_VENV}, "
            f"exit {done.returncode}); set {PYTHON_ENV_VAR} to use an existing install.\n"
            f"{done.stdout[-4000:]}"
        )
    error = _import_error(python)
    if error is not None:
        pytest.fail(f"{python} cannot import sglang.bench_serving after install:\n{error}")
    return python


class MockServer:
    """One ``pytest_kimi.mock.launch_server`` process (its own process group) and its log."""

    def __init__(self, argv: list[str], log: Path, url: str) -> None:
        self.url, self.log = url, log
        self._handle = log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            stdout=self._handle,
            stderr=subprocess.STDOUT,
            env=offline_env(),
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise AssertionError(f"mock server exited {self.popen.returncode}:\n{self.text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0, trust_env=False).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"mock server not healthy after {timeout_s:g}s:\n{self.text()}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._handle.close()
        assert not group_alive(self.popen.pid), "mock server's process group left running"


@pytest.fixture(scope="module")
def start_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``start_mock(*flags)`` starts a mock server on a free loopback port; stopped at teardown."""
    servers: list[MockServer] = []

    def start(*flags: str) -> MockServer:
        port = free_port()
        argv = [
            sys.executable, "-m", "pytest_kimi.mock.launch_server",
            "--model-path", str(TOKENIZER_DIR), "--host", "127.0.0.1", "--port", str(port),
            *flags,
        ]  # fmt: skip
        log = tmp_path_factory.mktemp("mock") / "server.log"
        server = MockServer(argv, log, f"http://127.0.0.1:{port}")
        servers.append(server)
        server.wait_healthy()
        return server

    yield start
    for server in servers:
        server.stop()
