"""Helpers to start real processes (mock servers, the SGLang Router) on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpcore  # noqa: F401  (see below)
import pytest

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.deploy.procgroup import group_alive
from pytest_kimi.testing.processes import NO_HYPOTHESIS, Proc, mock_argv

# httpx imports httpcore lazily, on first use. A pytester test restores sys.modules when it
# ends, so if that first use happens inside one, httpcore is imported again later with new
# exception classes, and httpx no longer recognises (maps) its errors. Import it up front.


@pytest.fixture
def small_mission(pytester: pytest.Pytester, leftovers):
    """The user's benchmark file on ``small_cluster.yaml`` (plus ``extra`` YAML), layout
    ``wide``, with ``args``; every test passes; the run folder."""
    here = Path(__file__).parent

    def run(*args: str, extra: str = "") -> Path:
        pytester.makefile(".yaml", cluster=(here / "small_cluster.yaml").read_text() + extra)
        user_file = (here.parent / "perf" / "test_speedbench.py").read_text()
        pytester.makepyfile(test_speedbench=user_file)
        result = pytester.runpytest_subprocess(
            "--cluster=cluster.yaml", "--layout=wide", *args, "--kimi-report-dir=out",
            "-p", "no:cacheprovider",
        )  # fmt: skip
        result.assert_outcomes(passed=5)
        [folder] = (pytester.path / "out").iterdir()
        return folder

    return run


@pytest.fixture
def pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    """pytest's own, with its child runs (in process or not) loading no hypothesis plugin
    (:data:`~pytest_kimi.testing.processes.NO_HYPOTHESIS`): ``runpytest_subprocess`` passes
    each name in ``plugins`` as ``-p``, an in-process run blocks it the same way."""
    pytester.plugins.append(NO_HYPOTHESIS[1])
    return pytester


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
            "--schedule-policy",
            "lpm",
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
