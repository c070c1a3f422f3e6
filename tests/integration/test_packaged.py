"""pytest-kimi as users install it: from any directory, costing nothing where unused.

pytester's folders lie outside this repository, so these runs see only the installed package:
its entry point, its packaged default cluster, dataset and tokenizer.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HEAVY = ("numpy", "httpx", "fabric", "paramiko", "matplotlib", "jinja2", "pydantic", "yaml",
         "orjson", "aiohttp", "prometheus_client")  # fmt: skip

USER_TEST = """
def test_tp32_meets_our_own_bar(kimi_result):
    summary = kimi_result.summary
    assert summary.completed == 40 and summary.failed == 0
    assert summary.metric("ttft_p95") < 60_000
"""

USER_CONFTEST = """
import json

def pytest_kimi_layout_result(config, result):
    with open("seen.json", "w") as fh:
        json.dump({"name": result.name, "completed": result.summary.completed}, fh)

def pytest_kimi_comparison(config, model):
    model["layouts"][0]["notes"].append("checked by the user's conftest")
"""


def test_packaged_default_runs_from_an_empty_directory(pytester: pytest.Pytester, leftovers):
    assert not (pytester.path / "clusters").exists()
    pytester.makepyfile(test_mine=USER_TEST)
    pytester.makeconftest(USER_CONFTEST)
    result = pytester.runpytest_subprocess("--layout=tp32", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    [run] = list((pytester.path / "reports").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["complete"] is True and summary["backend"] == "mock"
    # the hooks: a finished layout's result, and the comparison before it was written
    assert json.loads((pytester.path / "seen.json").read_text()) == {
        "name": "tp32",
        "completed": 40,
    }
    assert "checked by the user's conftest" in (run / "comparison.md").read_text()
    assert leftovers(pytester.path) == []


MODULES_CONFTEST = """
import sys

def pytest_sessionfinish(session):
    path = session.config.rootpath / "modules.txt"
    path.write_text("\\n".join(sorted(sys.modules)))
"""


def _modules(pytester: pytest.Pytester, *args: str) -> set[str]:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1)
    return set((pytester.path / "modules.txt").read_text().split())


def test_an_unrelated_suite_loads_nothing_heavy(pytester: pytest.Pytester):
    pytester.makeconftest(MODULES_CONFTEST)
    pytester.makepyfile(test_plain="def test_one():\n    assert 1 + 1 == 2\n")
    with_kimi = _modules(pytester)
    without = _modules(pytester, "-p", "no:kimi")
    assert "pytest_kimi.plugin" in with_kimi and "pytest_kimi.plugin" not in without
    added = sorted(with_kimi - without)
    assert [m for m in added if not m.startswith("pytest_kimi")] == [], added
    loaded_heavy = [m for m in HEAVY if m in with_kimi and m not in without]
    assert loaded_heavy == []


def test_packaged_default_is_the_repository_example():
    """clusters/local.yaml is the readable copy of what ships; they must not drift apart."""
    from pytest_kimi.config.options import DEFAULT_CLUSTER

    repo = Path(__file__).parents[2] / "clusters" / "local.yaml"
    assert DEFAULT_CLUSTER.read_bytes() == repo.read_bytes()
    packaged = importlib.resources.files("pytest_kimi") / "data" / "local.yaml"
    assert packaged.read_bytes() == repo.read_bytes()
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"data/*.yaml"' in pyproject  # it goes into the wheel
