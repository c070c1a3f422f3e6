"""The between-run table of a repeated point (``--kimi-repeat``): how much each figure moved
from one run to the next.

Per metric and layout: the runs, their mean, standard deviation, coefficient of variation,
the t interval of the mean, and each run's figure, from each layout's ``between_runs`` in the
report model (:mod:`pytest_kimi.results.repeats`). The comparison table's own figures pool the
runs' requests. Pure functions over the report model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kimi.report.categories import split_lines
from pytest_kimi.results import catalogue
from pytest_kimi.results.slo import format_value

HEADER = ("metric", "layout", "runs", "mean", "sd", "CV", "t interval of the mean", "each run")
CAPTION = (
    "Each layout's point measured in several runs (--kimi-repeat): per figure, the runs' "
    "mean, standard deviation, coefficient of variation (sd / mean) and Student's t interval "
    "of the mean, with each run's own figure. The table above pools the runs' requests (its "
    "throughputs and duration are the runs' means)."
)
METRICS = (*catalogue.COMPARISON_ROWS[3:], "success_rate")  # completed and failed: counts


def between_rows(section: Mapping[str, Any]) -> list[list[str]]:
    """One row per (metric, layout) that has a spread; empty when no layout was repeated."""
    rows = []
    for name in METRICS:
        unit = catalogue.metric(name).unit
        for layout in section["layouts"]:
            spread = (layout.get("between_runs") or {}).get(name)
            if spread is None:
                continue
            rows.append([name, layout["name"], str(spread["runs"]), *_cells(spread, unit)])
    return rows


def _cells(spread: Mapping[str, Any], unit: str) -> list[str]:
    def show(value: float | None) -> str:
        return "n/a" if value is None else format_value(value, unit)

    cv = "n/a" if spread["cv"] is None else f"{spread['cv']:.1%}"
    interval = (f"{spread['confidence']:.0%} [{show(spread['lower'])}, {show(spread['upper'])}]"
                if spread["lower"] is not None else "n/a")  # fmt: skip
    return [show(spread["mean"]), show(spread["sd"]), cv, interval,
            ", ".join(show(v) for v in spread["values"])]  # fmt: skip


def between_lines(section: Mapping[str, Any], heading: str) -> list[str]:
    """The table as Markdown under ``heading``; nothing when no layout was repeated."""
    return split_lines(heading, CAPTION, HEADER, between_rows(section))


def runs_words(section: Mapping[str, Any]) -> str:
    """``tp32 3 runs, pp8 3 runs`` where a layout was repeated, else ""."""
    repeated = [lay for lay in section["layouts"] if (lay.get("runs") or 1) > 1]
    return ", ".join(f"{lay['name']} {lay['runs']} runs" for lay in repeated)


def spread_lines(case: str, between_runs: Mapping[str, Any], names: list[str]) -> list[str]:
    """Terminal lines: the named metrics' spread over a repeated point's runs (``between_runs``
    as :class:`~pytest_kimi.results.repeats.Spread` objects)."""
    out = []
    for name in dict.fromkeys(names):
        if name not in between_runs:
            continue
        spread = between_runs[name].to_dict()
        mean, sd, cv, interval, _ = _cells(spread, catalogue.metric(name).unit)
        out.append(f"{case}: {name} over {spread['runs']} runs: mean {mean}, sd {sd}, CV {cv}, "
                   f"t interval {interval}")  # fmt: skip
    return out
