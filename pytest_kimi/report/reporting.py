"""The report step: which layouts the report covers, the comparison model, and its files.

The model is built from results read back from the run folder, so the live report, the xdist
controller's and ``python -m pytest_kimi.report`` rest on the same stored values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kimi.results.layout import LayoutResult

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.points import Point
    from pytest_kimi.results.store import RunFolder


def covered(
    layouts: Sequence[Layout],
    points: Sequence[Point],
    results: dict[tuple[str, str], LayoutResult],
    stopped_early: str,
    selected: frozenset[str] | None,
) -> list[LayoutResult]:
    """The (layout, point) results so far, in ``--layout`` order and each layout's points in
    order (``results`` by layout name and point id). With several points a layout's own
    result (point id "") is its deployment's: its notes (bring-up, teardown, logs) join each
    point's, and a deployment that never came up leaves each point its error. When the
    session stopped early, the selected layouts' points it never reached are added as not run
    (the report is incomplete)."""
    out = []
    for layout in layouts:
        deployment = results.get((layout.name, ""))
        told = False  # the deployment's notes are said once, with its first point reported
        for point in points:
            result = results.get((layout.name, point.id))
            if point.id and deployment is not None:
                if result is None and deployment.error:
                    result = _unmeasured(layout, point, deployment.error)
                elif result is not None and not told:
                    result.notes = [*deployment.notes, *result.notes]
                    told = True
            wanted = selected is None or layout.name in selected
            if result is None and stopped_early and results and wanted:
                result = _unmeasured(layout, point, f"not run: {stopped_early}")
            if result is not None:
                out.append(result)
    return out


def _unmeasured(layout: Layout, point: Point, error: str) -> LayoutResult:
    return LayoutResult(layout.name, layout.label, error=error, point=point.id,
                        point_settings=point.describe())  # fmt: skip


def comparison(
    results: Sequence[LayoutResult],
    *,
    run_id: str,
    backend: str,
    time_scale: float,
    stopped_early: str = "",
    setup: dict[str, Any] | None = None,
    searches: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The comparison model over ``results`` (None when there is nothing to compare): a table
    per workload point, the experiment's ``setup`` (:mod:`pytest_kimi.report.setup`), the
    verdict table with ``--kimi-find-max-concurrency``'s ``searches`` (layout -> outcome) and,
    over several points, the Pareto view's data."""
    from pytest_kimi.report.comparison import build_comparison
    from pytest_kimi.report.matrix import pareto, verdict_table

    if not results:
        return None
    model = build_comparison(
        results, run_id=run_id, backend=backend, time_scale=time_scale,
        stopped_early=stopped_early,
    )  # fmt: skip
    setup = setup or {}
    gpus = {name: entry.get("gpus") or 0 for name, entry in (setup.get("layouts") or {}).items()}
    model["setup"] = setup
    model["verdicts"] = verdict_table(model, gpus)
    if searches:
        model["max_concurrency"] = searches
        stopped = [f"{name}: the max-concurrency search {found['incomplete']}"
                   for name, found in searches.items() if found.get("incomplete")]  # fmt: skip
        model["incomplete"] = [*model["incomplete"], *stopped]
        model["complete"] = not model["incomplete"]
    if "points" in model:
        model["pareto"] = pareto(model, gpus)
    return model


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
    records = {r.case: r.records for r in results}
    counters = {r.case: r.replica_counters for r in results}
    telemetry = {r.case: r.telemetry_series for r in results}
    html = render_html(model, records, counters, telemetry)
    folder.write_comparison(model, render_markdown(model), html)
    if model.get("pareto"):
        from pytest_kimi.report.comparison import PARETO_IMAGE
        from pytest_kimi.report.paretoplot import pareto_figure
        from pytest_kimi.report.plots import svg

        folder.write_file(PARETO_IMAGE, svg(pareto_figure(model["pareto"])))


def terminal_lines(model: dict[str, Any], results: Sequence[LayoutResult]) -> list[str]:
    """The comparison table and each layout's SLO verdicts, for pytest's terminal summary."""
    from pytest_kimi.report.betweenruns import spread_lines
    from pytest_kimi.report.comparison import render_text

    lines = [render_text(model)]
    for result in results:
        lines += [f"{result.case}: {verdict.message()}" for verdict in result.verdicts]
        if result.between_runs:  # --kimi-repeat: how far the runs moved
            names = [verdict.slo.name for verdict in result.verdicts] + ["output_throughput"]
            lines += spread_lines(result.case, result.between_runs, names)
        if result.error:
            lines.append(f"{result.case}: not measured: {result.error.splitlines()[0]}")
    return lines
