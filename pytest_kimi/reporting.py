"""The report step: which layouts the report covers, the comparison model, and its files.

The model is built from results read back from the run folder, so the live report, the xdist
controller's and ``python -m pytest_kimi.report`` rest on the same stored values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kimi.result import LayoutResult

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.store import RunFolder


def covered(
    layouts: Sequence[Layout],
    results: dict[str, LayoutResult],
    stopped_early: str,
    selected: frozenset[str] | None,
) -> list[LayoutResult]:
    """The layouts run so far, in ``--layout`` order; when the session stopped early, the
    selected layouts it never reached are added as not run (the report is incomplete)."""
    out = []
    for layout in layouts:
        result = results.get(layout.name)
        wanted = selected is None or layout.name in selected
        if result is None and stopped_early and results and wanted:
            result = LayoutResult(layout.name, layout.label, error=f"not run: {stopped_early}")
        if result is not None:
            out.append(result)
    return out


def comparison(
    results: Sequence[LayoutResult],
    *,
    run_id: str,
    backend: str,
    time_scale: float,
    stopped_early: str = "",
) -> dict[str, Any] | None:
    """The comparison model over ``results`` (None when there is nothing to compare)."""
    from pytest_kimi.report.comparison import build_comparison

    if not results:
        return None
    return build_comparison(
        results, run_id=run_id, backend=backend, time_scale=time_scale,
        stopped_early=stopped_early,
    )  # fmt: skip


def write(
    folder: RunFolder,
    model: dict[str, Any],
    results: Sequence[LayoutResult],
    before_write: Callable[[dict[str, Any]], None] = lambda model: None,
) -> None:
    """``comparison.json``, ``comparison.md`` and ``report.html`` into the run folder;
    ``before_write`` (the ``pytest_kimi_comparison`` hook) sees the model first."""
    from pytest_kimi.report.comparison import render_markdown
    from pytest_kimi.report.html import render_html

    before_write(model)
    records = {r.name: r.records for r in results}
    counters = {r.name: r.replica_counters for r in results}
    telemetry = {r.name: r.telemetry_series for r in results}
    html = render_html(model, records, counters, telemetry)
    folder.write_comparison(model, render_markdown(model), html)


def terminal_lines(model: dict[str, Any], results: Sequence[LayoutResult]) -> list[str]:
    """The comparison table and each layout's SLO verdicts, for pytest's terminal summary."""
    from pytest_kimi.report.comparison import render_text

    lines = [render_text(model)]
    for result in results:
        lines += [f"{result.name}: {verdict.message()}" for verdict in result.verdicts]
        if result.error:
            lines.append(f"{result.name}: not measured: {result.error.splitlines()[0]}")
    return lines
