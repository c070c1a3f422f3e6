"""Fixtures every test of the suite gets."""

from __future__ import annotations

import pytest

XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


@pytest.fixture(autouse=True)
def _children_are_not_xdist_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``-n``, this process is an xdist worker and its environment says so. A child run
    a test starts (``pytester.runpytest_subprocess``, ``python -m pytest``, a mock or a router)
    inherits that environment and would take itself for a worker: the plugin would pick the
    plain display, and pytest-benchmark would refuse to save. The worker itself knows what it
    is from ``config.workerinput``, not from these variables."""
    for name in XDIST_ENV:
        monkeypatch.delenv(name, raising=False)
