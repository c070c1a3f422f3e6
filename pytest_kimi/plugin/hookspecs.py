"""Hooks pytest-kimi calls, for users' ``conftest.py`` files and other plugins.

Implement them like any pytest hook::

    def pytest_kimi_layout_result(config, result):
        print(result.name, result.summary.metric("ttft_p95"))

    def pytest_kimi_comparison(config, model):
        model["layouts"][0]["notes"].append("checked by our conftest")
        # a sweep's model has a comparison per workload point: model["points"][i]["layouts"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy
import pytest

if TYPE_CHECKING:
    from pytest_kimi.results.layout import LayoutResult

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_kimi_layout_result(config: pytest.Config, result: LayoutResult) -> None:
    """A layout's run has finished and its ``summary.json`` is written: records, summary,
    SLO verdicts and notes are in ``result`` (``result.error`` says why when it failed).
    With workload points, once per point (``result.point``). Called in the process that
    measured it (an xdist worker under ``-n``)."""


@hookspec
def pytest_kimi_comparison(config: pytest.Config, model: dict[str, Any]) -> None:
    """The comparison model (what ``comparison.json`` holds) before it is written and rendered:
    a hook may add notes or keys; what it leaves in ``model`` is written."""
