"""``--kimi-find-max-concurrency``: the highest concurrency at which a layout still meets every
SLO, found by doubling from the low end of the concurrency range, then bisecting between the
last level that met them and the first that did not.

Latency grows with load, so "meets every SLO" is taken as monotone in concurrency: the search
measures O(log range) levels instead of all of them. Each level is a full measured run (its own
records and summary); a level already measured (a listed workload point) is not measured again.
The search is a pure function of a ``judge(concurrency)`` callback, so its steps are tested
without a deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Judge = Callable[[int], Sequence[str]]
"""Measure at a concurrency; what it failed (SLO names, failed requests; empty: met all).
Raises :class:`NotMeasured` when the level could not be measured at all."""


class NotMeasured(Exception):
    """A level that could not be measured (the deployment was lost, the warm-up failed): the
    search stops there instead of reading it as a level that failed its SLOs."""


@dataclass
class Search:
    """The search's outcome: the highest level that met every SLO (None: not even the lowest,
    or the search stopped: ``incomplete`` says why), the first level above it that failed and
    what failed there, every level tried in order, and whether the top of the range was
    reached with every level met (``capped``)."""

    low: int
    high: int
    max_concurrency: int | None = None
    first_failing: int | None = None
    failed_slos: list[str] = field(default_factory=list)
    tried: list[int] = field(default_factory=list)
    capped: bool = False
    incomplete: str = ""  # why the search stopped before an answer ("" when it has one)
    settings: dict[str, Any] = field(default_factory=dict)  # the other settings it ran with

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Search:
        return cls(**data)


def find_max_concurrency(low: int, high: int, judge: Judge) -> Search:
    """Doubling from ``low`` (capped at ``high``), then bisection; see the module docstring.
    A level that cannot be measured ends the search without an answer (``incomplete``)."""
    search = Search(low, high)
    try:
        _search(search, judge)
    except NotMeasured as exc:
        search.max_concurrency, search.first_failing, search.failed_slos = None, None, []
        search.incomplete = f"stopped at concurrency {search.tried[-1]}: {exc}"
    return search


def _search(search: Search, judge: Judge) -> None:
    low, high = search.low, search.high
    if not 1 <= low <= high:
        raise ValueError(f"the concurrency range must satisfy 1 <= low <= high, got {low}..{high}")
    failures: dict[int, list[str]] = {}

    def met(level: int) -> bool:
        search.tried.append(level)
        failures[level] = list(judge(level))
        return not failures[level]

    if not met(low):
        search.first_failing, search.failed_slos = low, failures[low]
        return
    passed, failed = low, None
    while passed < high:
        level = min(passed * 2, high)
        if met(level):
            passed = level
        else:
            failed = level
            break
    if failed is None:
        search.max_concurrency, search.capped = passed, True
        return
    while failed - passed > 1:
        level = (passed + failed) // 2
        if met(level):
            passed = level
        else:
            failed = level
    search.max_concurrency = passed
    search.first_failing, search.failed_slos = failed, failures[failed]
