"""The ``ssh_hosts`` fixture: 8 SSH test hosts (node601..node608) in network namespaces; the
``slurm`` fixture: a real Slurm on them, for one test module.

Needs root, ``ip``, ``unshare`` and OpenSSH (``scripts/ci_system_deps.sh``). Where that is missing
the fixture skips with the reason; set ``KIMI_SSH_HOSTS_REQUIRED=1`` (CI) to fail instead. The
``slurm`` fixture needs slurm-wlm and munge too; ``KIMI_SLURM_REQUIRED=1`` makes it fail rather
than skip without them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import pytest
from slurmhosts import SlurmCluster, SlurmUnavailable
from slurmhosts import preflight as slurm_preflight
from testhosts import TestCluster, TestHostsUnavailable

N_HOSTS = 8


def _unavailable(request: pytest.FixtureRequest, reason: str) -> None:
    message = f"SSH test hosts unavailable: {reason}"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(message, yellow=True)
    if os.environ.get("KIMI_SSH_HOSTS_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{message} (KIMI_SSH_HOSTS_REQUIRED is set)", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while the hosts exist, so pytest tears them down."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def testhosts_preflight(request: pytest.FixtureRequest) -> None:
    """Skip (or fail with KIMI_SSH_HOSTS_REQUIRED=1) where test hosts cannot be built."""
    try:
        TestCluster.preflight()
    except TestHostsUnavailable as exc:
        _unavailable(request, str(exc))


@pytest.fixture(scope="session")
def ssh_hosts(
    request: pytest.FixtureRequest, tmp_path_factory, testhosts_preflight
) -> Iterator[TestCluster]:
    """Session-wide ``TestCluster`` of 8 hosts; torn down (and verified empty) at session end."""
    run_dir = tmp_path_factory.mktemp("ssh-hosts")
    with _sigterm_as_interrupt():
        try:
            cluster = TestCluster.create(N_HOSTS, run_dir)
        except TestHostsUnavailable as exc:
            _unavailable(request, str(exc))
        try:
            yield cluster
        finally:
            cluster.close()


@pytest.fixture(scope="module")
def slurm(ssh_hosts: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Slurm on the session's 8 test hosts for this module; stopped and checked empty after."""
    try:
        slurm_preflight()
    except SlurmUnavailable as exc:
        if os.environ.get("KIMI_SLURM_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"Slurm unavailable: {exc} (KIMI_SLURM_REQUIRED is set)", pytrace=False)
        pytest.skip(f"Slurm unavailable: {exc}")
    cluster = SlurmCluster.create(ssh_hosts, tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.close()
