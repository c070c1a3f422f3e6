"""Helpers to start real processes (mock servers, the SGLang Router) on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpcore  # noqa: F401  (see below)
import httpx
import pytest

from pytest_kimi.deploy.executor import group_alive
from pytest_kimi.deploy.plan import free_port
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR

# httpx imports httpcore lazily, on first use. A pytester test restores sys.modules when it
# ends, so if that first use happens inside one, httpcore is imported again later with new
# exception classes, and httpx no longer recognises (maps) its errors. Import it up front.


class Proc:
    """A started process with its log; stopped (whole group) by the fixture."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self.handle = log.open("wb")
        self.popen = subprocess.Popen(
            argv, stdout=self.handle, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise AssertionError(f"process exited {self.popen.returncode}:\n{self.text()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{url} not up after {timeout}s:\n{self.text()}")

    def stop(self) -> None:
        import os
        import signal

        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.handle.close()
        assert not group_alive(self.popen.pid), "process group left running"


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator:
    """Start processes; every one is stopped and checked gone at teardown."""
    procs: list[Proc] = []

    def start(argv: list[str], name: str = "proc") -> Proc:
        proc = Proc(argv, tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()


def mock_argv(port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest_kimi.mock.launch_server",
        "--model-path", str(TOKENIZER_DIR), "--host", "127.0.0.1", "--port", str(port),
        *extra,
    ]  # fmt: skip


@pytest.fixture
def mock_server(spawn) -> Iterator[str]:
    """One single-node mock server at a fast time scale; yields its base URL."""
    port = free_port()
    proc = spawn(
        mock_argv(
            port,
            "--tp-size",
            "8",
            "--enable-metrics",
            "--mock-time-scale",
            "1000",
            "--some-future-flag",
            "x",
        ),
        "mock",
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    yield url


@pytest.fixture
def mock_cmd():
    """Build a mock server command line: ``mock_cmd(port, *flags)``."""
    return mock_argv


def pids_mentioning(path: Path) -> list[int]:
    """Live processes whose command line mentions ``path``: what a run under it left behind."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if str(path).encode() in cmd and group_alive(int(entry)):
                found.append(int(entry))
    return found


@pytest.fixture
def leftovers():
    """``leftovers(path)``: processes still running whose command line mentions ``path``."""
    return pids_mentioning
