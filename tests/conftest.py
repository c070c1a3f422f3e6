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


# Seconds each of the longest modules took on three workers beside a one-core busy loop
# (2026-12-07, a fresh clone's `.ci/run`). Under `--dist loadscope` the workers take modules in
# collection order (see pytest_xdist_make_scheduler); longest first (the LPT rule) keeps one
# worker from running a long module alone at the end. Only the order depends on these figures:
# refresh them when a module's time changes by minutes.
LONGEST_MODULES = {
    "tests/realsglang/test_mission.py": 575,
    "tests/realsglang/test_attach.py": 324,
    "tests/ssh/test_slurm_deploy.py": 318,
    "tests/integration/test_plugin.py": 314,
    "tests/ssh/test_ssh_outages.py": 276,
    "tests/ssh/test_ssh_real_sglang.py": 167,
    "tests/integration/test_reliability.py": 165,
    "tests/ssh/test_ssh_deploy.py": 129,
    "tests/ssh/test_ssh_containers.py": 120,
    "tests/conformance/test_mock_vs_sglang.py": 105,
    "tests/integration/test_twin_live.py": 93,
    "tests/ssh/test_ssh_leftovers.py": 79,
    "tests/realsglang/test_teardown.py": 73,
    "tests/ssh/test_ssh_bastion.py": 70,
    "tests/integration/test_telemetry_mission.py": 57,
    "tests/conformance/test_real_parsers.py": 49,
    "tests/integration/test_history_run.py": 47,
    "tests/integration/test_open_loop.py": 42,
    "tests/integration/test_router_packages.py": 42,
    "tests/integration/test_client_accuracy.py": 41,
}

# The modules that start real SGLang servers, in two units of work of about equal length: each
# server start is ~20 s of CPU (importing torch, building the model), so three such modules at
# once held the machine at load 17, and all four on one worker were the suite's longest chain
# (19 minutes beside a one-core busy loop). Under `--dist loadscope` each unit is one worker's,
# its modules one after another, while the third worker runs the rest.
REAL_SGLANG_UNITS = {
    "tests/realsglang/test_mission.py": "real-sglang-mission",
    "tests/realsglang/test_teardown.py": "real-sglang-mission",
    "tests/realsglang/test_attach.py": "real-sglang-attached",
    "tests/ssh/test_ssh_real_sglang.py": "real-sglang-attached",
}


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(trylast=True)  # after pytest groups items by fixture parameter
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-SGLang modules first, then the longest modules; each module's items kept
    together and in their order."""
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(_module(item.nodeid), i)

    def key(item: pytest.Item) -> tuple[bool, int, int]:
        module = _module(item.nodeid)
        return (module not in REAL_SGLANG_UNITS, -LONGEST_MODULES.get(module, 0),
                first_seen[module])  # fmt: skip

    items.sort(key=key)  # stable: within a module, the order pytest collected


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadscope`` with two changes: the real-SGLang modules are two scopes
    (:data:`REAL_SGLANG_UNITS`), and scopes go out in collection order (the order above), not
    reordered by how many tests each has."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            unit = REAL_SGLANG_UNITS.get(_module(nodeid))
            return unit if unit is not None else super()._split_scope(nodeid)

    config.option.loadscopereorder = False
    return Scheduling(config, log)
