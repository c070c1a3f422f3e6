"""The A/B comparison: the seed report's table for any number of layouts.

One report model (:func:`build_comparison`, plain JSON-able data) and renderers over it
(Markdown for ``comparison.md``, aligned text for the terminal). The first layout is the
reference; every other layout gets a relative-delta column against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pytest_kimi.report.betweenruns import between_lines, runs_words
from pytest_kimi.report.categories import category_lines
from pytest_kimi.report.matrixtext import pareto_lines, setup_lines, verdict_lines
from pytest_kimi.report.turns import turn_lines
from pytest_kimi.results import catalogue
from pytest_kimi.results.layout import LayoutResult, verdict_from_dict, verdict_to_dict
from pytest_kimi.results.metrics import per_request_ms
from pytest_kimi.results.pdstages import ttft_lines
from pytest_kimi.results.slo import format_value
from pytest_kimi.results.stats import bootstrap_delta
from pytest_kimi.results.summary import Summary

__all__ = [
    "ROWS", "LayoutResult", "build_comparison", "incomplete_reasons", "render_markdown",
    "sections",
]  # fmt: skip


PARETO_IMAGE = "pareto.svg"
"""The Pareto plot beside comparison.md (report.html has it inline)."""

ROWS: tuple[tuple[str, str, str], ...] = tuple(
    (name, catalogue.metric(name).label, catalogue.metric(name).unit)
    for name in catalogue.COMPARISON_ROWS
)
"""(metric, row label, unit) of the table, from the catalogue."""


def _described(names: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
    return tuple((n, catalogue.metric(n).label, catalogue.metric(n).unit) for n in names)


def _rows(results: Sequence[LayoutResult]) -> tuple[tuple[str, str, str], ...]:
    """The seed's rows, plus TTFAT and the reasoning split after the TTFT rows when any layout
    streamed reasoning tokens (elsewhere they would repeat TTFT and the output tokens), the
    accept length after the TPOT rows when any layout decoded speculatively, the dispatch
    delay and the latencies from the schedule after the E2E rows when any layout ran open
    loop, plus the GPU telemetry rows at the end when any layout's GPUs were sampled."""
    rows = ROWS
    if any(r.summary is not None and r.summary.total_reasoning_tokens > 0 for r in results):
        at = max(i for i, (name, _, _) in enumerate(ROWS) if name.startswith("ttft_")) + 1
        rows = ROWS[:at] + _described(catalogue.REASONING_ROWS) + ROWS[at:]
    if any(r.summary is not None and not math.isnan(r.summary.spec_accept_length)
           for r in results):  # fmt: skip
        at = max(i for i, (name, _, _) in enumerate(rows) if name.startswith("tpot_")) + 1
        rows = rows[:at] + _described(catalogue.SPEC_ROWS) + rows[at:]
    if any(r.summary is not None and r.summary.open_loop for r in results):
        at = max(i for i, (name, _, _) in enumerate(rows) if name.startswith("e2e_")) + 1
        rows = rows[:at] + _described(catalogue.SCHEDULE_ROWS) + rows[at:]
    if any(r.telemetry is not None for r in results):
        rows += _described(catalogue.TELEMETRY_ROWS)
    return rows


def _value(result: LayoutResult, metric: str) -> float | None:
    if metric in catalogue.TELEMETRY:
        return None if result.telemetry is None else result.telemetry.figure(metric)
    summary: Summary | None = result.summary
    if summary is None:
        return None
    value = summary.metric(metric)
    return None if math.isnan(value) else float(value)


def relative_delta(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return (value - reference) / reference


def build_comparison(
    results: Sequence[LayoutResult],
    *,
    run_id: str,
    backend: str,
    time_scale: float,
    stopped_early: str = "",
) -> dict[str, Any]:
    """The report model: rows of values per layout and deltas against the first layout; for a
    sweep (results at several workload points) one such table per point under ``points``, in
    the order measured.

    A layout without a complete measurement (its error says why) marks the model incomplete;
    ``stopped_early`` (Ctrl-C, SIGTERM, ``-x``) is then named as the first reason.
    """
    if not results:
        raise ValueError("no layout results to compare")
    reasons = incomplete_reasons(results, stopped_early)
    head = {
        "run_id": run_id,
        "backend": backend,
        "time_scale": time_scale,
        "complete": not reasons,
        "incomplete": reasons,
        "reference": results[0].name,
    }
    if not any(r.point for r in results):
        return {**head, **_table(results, time_scale)}
    groups: dict[str, list[LayoutResult]] = {}
    for result in results:
        groups.setdefault(result.point, []).append(result)
    points = [
        {"id": point, "settings": dict(group[0].point_settings), **_table(group, time_scale)}
        for point, group in groups.items()
    ]
    return {**head, "points": points}


def _table(results: Sequence[LayoutResult], time_scale: float) -> dict[str, Any]:
    """One comparison: the reference, each layout's entry and the rows."""
    ref = results[0]
    samples = {
        r.name: per_request_ms(r.records, time_scale=time_scale) if r.records else None
        for r in results
    }
    rows = []
    for metric, label, unit in _rows(results):
        values = {r.name: _value(r, metric) for r in results}
        deltas = {r.name: relative_delta(values[r.name], values[ref.name]) for r in results[1:]}
        row = {"metric": metric, "label": label, "unit": unit, "values": values, "delta": deltas}
        row_ci = _intervals(metric, ref, results[1:], samples)
        if row_ci is not None:
            row["ci"] = row_ci
        rows.append(row)
    layouts = [
        {
            "name": r.name,
            "label": r.label,
            "result_dir": r.result_dir,
            "error": r.error,
            "notes": list(r.notes),
            "summary": r.summary.to_dict() if r.summary else None,
            "slo": [verdict_to_dict(v) for v in r.verdicts],
            "telemetry": r.telemetry.to_dict() if r.telemetry else None,
            "pd_stages": r.stage_times.to_dict() if r.stage_times else None,
            "runs": r.runs,  # --kimi-repeat: the runs its figures pool, and their spread
            "between_runs": {name: s.to_dict() for name, s in r.between_runs.items()},
        }
        for r in results
    ]
    return {"reference": ref.name, "layouts": layouts, "rows": rows}


def sections(model: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's comparisons: one per workload point of a sweep, else the model itself."""
    return list(model["points"]) if "points" in model else [model]


def point_title(section: dict[str, Any]) -> str:
    """``c8: concurrency 8, request_rate inf`` for a sweep's point; "" otherwise."""
    if not section.get("id"):
        return ""
    settings = ", ".join(f"{k} {v}" for k, v in section.get("settings", {}).items())
    return f"{section['id']}: {settings}" if settings else section["id"]


def incomplete_reasons(results: Sequence[LayoutResult], stopped_early: str = "") -> list[str]:
    """Why a report is not the full answer: a layout was not run or not measured in full
    (its error's first line), and if so, why the session stopped early."""
    reasons = [f"{r.case}: {r.error.splitlines()[0]}" for r in results if r.error]
    if reasons and stopped_early:
        reasons.insert(0, f"session stopped early: {stopped_early}")
    return reasons


def _intervals(
    metric: str,
    ref: LayoutResult,
    others: Sequence[LayoutResult],
    samples: dict[str, dict[str, list[float]] | None],
) -> dict[str, dict | None] | None:
    """Bootstrap CIs of a latency row's deltas, each saying how many runs' pooled requests it
    rests on (``runs``: the reference's, the other's); None for rows that are not latencies,
    and for a maximum (one request: the bootstrap says nothing about it)."""
    m = catalogue.metric(metric)
    prefix, stat = m.prefix, m.stat
    base = samples.get(ref.name)
    if not m.per_request or base is None or not catalogue.gateable(m):
        return None
    out: dict[str, dict | None] = {}
    for r in others:
        other = samples.get(r.name)
        ci = bootstrap_delta(base[prefix], other[prefix], stat) if other else None
        out[r.name] = {**ci.to_dict(), "runs": [ref.runs, r.runs]} if ci else None
    return out


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.2f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    if unit in ("count", "W"):
        return f"{value:.0f}"
    return f"{value:.2f}"


def _delta(value: float | None, ci: dict | None = None) -> str:
    if value is None:
        return "n/a"
    if not ci:
        return f"{value:+.2%}"
    mark = "*" if ci["excludes_zero"] else ""
    return f"{value:+.2%} [{ci['low']:+.1%}, {ci['high']:+.1%}]{mark}"


def table_rows(model: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    names = [layout["name"] for layout in model["layouts"]]
    labels = {layout["name"]: layout["label"] for layout in model["layouts"]}
    ref = model["reference"]
    header = ["metric", *[f"{n} ({labels[n]})" for n in names]]
    header += [f"{n} vs {ref}" for n in names[1:]]
    body = []
    for row in model["rows"]:
        cells = [row["label"], *[_cell(row["values"][n], row["unit"]) for n in names]]
        cis = row.get("ci") or {}
        cells += [_delta(row["delta"][n], cis.get(n)) for n in names[1:]]
        body.append(cells)
    return header, body


def backend_label(model: dict[str, Any]) -> str:
    if model["backend"] == "mock":
        return f"mock backend, time scale 1:{model['time_scale']:g} (figures in cluster time)"
    return f"{model['backend']} backend"


def render_markdown(model: dict[str, Any]) -> str:
    lines = [
        f"# Layout comparison: {model['run_id']}",
        "",
        *_incomplete_banner(model),
        f"Backend: {backend_label(model)}. Reference layout: `{model['reference']}`; "
        "deltas are relative to it.",
        "",
        *setup_lines(model.get("setup") or {}),
    ]
    for section in sections(model):
        title = point_title(section)
        level = "###" if title else "##"
        if title:
            lines += ["", f"## Workload point {title}"]
        lines += ["", *_markdown_table(section)]
        lines += ["", f"{level} SLO verdicts", "", *_verdict_lines(section)]
        lines += between_lines(section, f"{level} Between runs")
        lines += category_lines(section, f"{level} Per SPEED-Bench category")
        lines += turn_lines(section, f"{level} Per session turn")
        lines += ttft_lines(section, f"{level} Prefill/decode disaggregation: where TTFT goes")
    lines += ["", *pareto_lines(model.get("pareto") or {}, PARETO_IMAGE)]
    lines += verdict_lines(model.get("verdicts") or [], model.get("max_concurrency") or {})
    if model.get("trends"):
        from pytest_kimi.report.trendplot import trend_caption

        lines += ["", "## Trend across the history", "", "Plots in report.html.", ""]
        lines += [f"- {trend_caption(trend)}" for trend in model["trends"]]
    notes = [(case, n) for case, layout in cases(model) for n in layout["notes"]]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- **{name}**: {note}" for name, note in notes]
    return "\n".join(lines) + "\n"


def cases(model: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(``tp32`` or ``tp32-c8``, the layout's entry) over every section."""
    return [
        (f"{lay['name']}-{sec['id']}" if sec.get("id") else lay["name"], lay)
        for sec in sections(model)
        for lay in sec["layouts"]
    ]


def _markdown_table(section: dict[str, Any]) -> list[str]:
    header, body = table_rows(section)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    if any(row.get("ci") for row in section["rows"]):
        runs = runs_words(section)
        pooled = f" (pooled over the runs: {runs})" if runs else ""
        lines += [
            "",
            f"Latency deltas carry a 95% bootstrap interval from the per-request records{pooled}; "
            "`*` marks a difference whose interval excludes zero (real, not resampling noise).",
        ]
    return lines


def _verdict_lines(section: dict[str, Any]) -> list[str]:
    lines = []
    for layout in section["layouts"]:
        if layout["error"]:
            lines.append(f"- **{layout['name']}**: not measured: {layout['error'].splitlines()[0]}")
            continue
        for slo in layout["slo"]:
            measured = format_value(
                float("nan") if slo["measured"] is None else slo["measured"], slo["unit"]
            )
            op = "<=" if slo["upper_bound"] else ">="
            state = _STATES[slo.get("outcome") or ("passed" if slo["passed"] else "failed")]
            limit = format_value(slo["limit"], slo["unit"])
            line = f"- **{layout['name']}** {slo['name']} {op} {limit}: {state} "
            line += f"(measured {measured}"
            if slo.get("interval"):
                line += f"; {interval_text(slo)}"
            lines.append(line + ")" + (f": {slo['why']}" if slo.get("why") else ""))
    return lines


_STATES = {"passed": "PASS", "failed": "FAIL", "undecided": "UNDECIDED"}


def interval_text(saved: dict[str, Any]) -> str:
    """A saved verdict's bounds, worded as the verdict's own message words them."""
    return verdict_from_dict(saved).interval_text()


def _incomplete_banner(model: dict[str, Any]) -> list[str]:
    if model.get("complete", True):
        return []
    lines = ["**INCOMPLETE RUN**: these figures are not the full answer.", ""]
    lines += [f"- {reason}" for reason in model.get("incomplete", [])]
    return [*lines, ""]


def render_text(model: dict[str, Any]) -> str:
    """Aligned plain text for pytest's terminal summary (a table per workload point)."""
    out = []
    if not model.get("complete", True):
        out.append("INCOMPLETE RUN: " + "; ".join(model.get("incomplete", [])))
    out.append(f"{backend_label(model)}; reference {model['reference']}")
    for section in sections(model):
        title = point_title(section)
        if title:
            out.append(f"-- workload point {title}")
        header, body = table_rows(section)
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        for row in [header, *body]:
            first = row[0].ljust(widths[0])
            rest = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
            out.append("  ".join([first, *rest]))
    return "\n".join(out)
