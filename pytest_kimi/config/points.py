"""Workload points: the settings a run sweeps (concurrency, request rate, prompts, lengths, API,
category) and the ids that name them in test items and folders.

A point is the cluster file's workload with a few settings replaced. Settings come as lists
from the command line (``--kimi-concurrency 1,8,32``) or the cluster file
(``workload.concurrency: [1, 8, 32]``); the points are every combination, concurrency varying
fastest, in the order given: a layout brought up once serves them one after another. Only
the settings with more than one value name a point (``c8``, ``c8-out1k``): a run without a
sweep has one point with an empty id, and its items and folders are named as the layout alone.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kimi.config import WorkloadConfig

SWEPT: tuple[str, ...] = (
    "concurrency", "request_rate", "num_requests", "input_len", "output_len", "api", "category",
)  # fmt: skip
"""The workload settings a point can set, in the order their parts appear in an id."""

OPTION = {
    "concurrency": "--kimi-concurrency",
    "request_rate": "--kimi-request-rate",
    "num_requests": "--kimi-num-prompts",
    "input_len": "--kimi-input-len",
    "output_len": "--kimi-output-len",
    "api": "--kimi-api",
    "category": "--kimi-category",
}
"""The command-line option of each setting."""

_PREFIX = {"concurrency": "c", "request_rate": "r", "num_requests": "n", "input_len": "in",
           "output_len": "out", "api": "", "category": ""}  # fmt: skip


_NAME = re.compile(r"[A-Za-z0-9_.]+")


class PointError(ValueError):
    """A setting's values cannot make points; the message names the option or field."""


@dataclass(frozen=True)
class Point:
    """One workload point: the settings it replaces (setting -> value, in :data:`SWEPT`
    order) and which of them vary across the run's points (those name it)."""

    settings: tuple[tuple[str, Any], ...] = ()
    varied: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``c8``, ``c8-r2``, ``in16k-out512``; "" for the one point of a run without a sweep."""
        return "-".join(part(name, value) for name, value in self.settings if name in self.varied)

    def value(self, name: str, default: Any = None) -> Any:
        """One setting this point sets (``default`` when it leaves the workload's)."""
        return dict(self.settings).get(name, default)

    def apply(self, workload: WorkloadConfig) -> WorkloadConfig:
        """The cluster file's workload with this point's settings."""
        return replace(workload, **dict(self.settings))

    def describe(self) -> dict[str, Any]:
        """The settings as JSON-able data (``inf`` as the string ``"inf"``)."""
        return {name: jsonable(value) for name, value in self.settings}


def part(name: str, value: Any) -> str:
    """One setting's part of a point id: ``c8``, ``r2.5``, ``rinf``, ``in16k``, ``chat``."""
    if name in ("input_len", "output_len") and value % 1024 == 0:
        return f"{_PREFIX[name]}{value // 1024}k"
    if isinstance(value, float):
        short = f"{value:g}"  # 2.5, inf; exact, or two rates would share a folder
        return f"{_PREFIX[name]}{short if float(short) == value else repr(value)}"
    return f"{_PREFIX[name]}{value}"


def jsonable(value: Any) -> Any:
    """A setting as JSON can hold it: ``inf`` (an open-loop rate) as the string ``"inf"``."""
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def points(values: Mapping[str, Sequence[Any]]) -> tuple[Point, ...]:
    """Every combination of ``values`` (setting -> its values), the first setting of
    :data:`SWEPT` varying fastest. Settings with one value are set but do not name points."""
    names = [n for n in SWEPT if n in values]
    for name in names:
        where = f"{OPTION[name]} (or workload.{name})"
        if not values[name]:
            raise PointError(f"{where}: no values")
        if len(set(values[name])) != len(values[name]):
            raise PointError(f"{where}: a value is given twice: {list(values[name])}")
        for value in values[name]:
            if isinstance(value, str) and not _NAME.fullmatch(value):
                raise PointError(f"{where}: {value!r} cannot name a point's folder and test "
                                 "ids (letters, digits, '.', '_' only)")  # fmt: skip
    varied = tuple(n for n in names if len(values[n]) > 1)
    slow_first = list(reversed(names))
    out = []
    for combo in itertools.product(*(values[n] for n in slow_first)):
        chosen = dict(zip(slow_first, combo, strict=True))
        out.append(Point(tuple((n, chosen[n]) for n in names), varied))
    return tuple(out)


def parse_values(name: str, text: str) -> list[Any]:
    """One option's comma-separated values, typed and checked; errors name the option."""
    option = OPTION[name]
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise PointError(f"{option} {text!r}: an empty value (give a comma-separated list)")
    return [_parse(name, option, item) for item in items]


def _parse(name: str, option: str, item: str) -> Any:
    """One value as the setting's type: words as given, a rate > 0 or inf, else a count."""
    if name in ("api", "category"):
        return item
    if name == "request_rate":
        try:
            rate = float(item)
        except ValueError:
            rate = math.nan
        if not rate > 0:  # NaN included
            raise PointError(f"{option}: {item!r} is not a positive number of requests/s or inf")
        return rate
    try:
        count = int(item)
    except ValueError:
        count = 0
    if count < 1:
        raise PointError(f"{option}: {item!r} is not a positive whole number")
    return count
