"""The answer across the matrix: per workload point, which layouts meet every SLO and which of
them gives the most output throughput per GPU; and the Pareto view's data (throughput per GPU
against TPOT p95 and TTFT p95, one curve per layout over the points).

Pure functions of the comparison model (:mod:`pytest_kimi.report.comparison`) and each
layout's GPU count (from its manifest): the Markdown, JSON and HTML all render these values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kimi.report.comparison import sections

PARETO_AXES: tuple[tuple[str, str], ...] = (("tpot_p95", "TPOT p95"), ("ttft_p95", "TTFT p95"))
"""(metric, label) of the latencies the Pareto view plots throughput per GPU against."""


def value(section: Mapping[str, Any], metric: str, layout: str) -> float | None:
    """One cell of a section's table (None where not measured)."""
    for row in section["rows"]:
        if row["metric"] == metric:
            return row["values"].get(layout)
    return None


def per_gpu(section: Mapping[str, Any], layout: str, gpus: Mapping[str, int]) -> float | None:
    """Output tokens/s per GPU the layout occupies (its replicas' nodes' GPUs)."""
    throughput = value(section, "output_throughput", layout)
    count = gpus.get(layout)
    if throughput is None or not count:
        return None
    return throughput / count


def meets_every_slo(entry: Mapping[str, Any]) -> bool:
    """Measured in full, no request failed, and no SLO verdict failed: fast answers from the
    requests that survived do not make a layout fit to ship when others timed out."""
    summary = entry["summary"]
    return (
        not entry["error"]
        and summary is not None
        and not summary.get("failed")
        and all(slo["passed"] for slo in entry["slo"])
    )


def undecided_only(entry: Mapping[str, Any]) -> bool:
    """Not meeting every SLO only because some are undecided (``--kimi-confidence``): none
    failed, no request failed. Not fit to ship on this evidence, but not shown to fail."""
    summary = entry["summary"]
    outcomes = {slo.get("outcome") or ("passed" if slo["passed"] else "failed")
                for slo in entry["slo"]}  # fmt: skip
    return (not entry["error"] and summary is not None and not summary.get("failed")
            and "undecided" in outcomes and "failed" not in outcomes)  # fmt: skip


def verdict_table(model: Mapping[str, Any], gpus: Mapping[str, int]) -> list[dict[str, Any]]:
    """Per workload point: the layouts meeting every SLO, their throughput per GPU, and the
    best of them (None when none meets them); ``undecided``: those kept from meeting them only
    by undecided SLOs (named apart from the ones that failed)."""
    table = []
    for section in sections(model):
        names = [entry["name"] for entry in section["layouts"]]
        meeting = [e["name"] for e in section["layouts"] if meets_every_slo(e)]
        undecided = [e["name"] for e in section["layouts"] if undecided_only(e)]
        throughput = {name: per_gpu(section, name, gpus) for name in names}
        ranked = [name for name in meeting if throughput[name] is not None]
        best = max(ranked, key=lambda name: throughput[name]) if ranked else None
        table.append({
            "point": section.get("id", ""),
            "settings": dict(section.get("settings") or {}),
            "meeting": meeting,
            "failing": [name for name in names if name not in meeting + undecided],
            "undecided": undecided,
            "output_throughput_per_gpu": throughput,
            "best": best,
        })  # fmt: skip
    return table


def pareto(model: Mapping[str, Any], gpus: Mapping[str, int]) -> dict[str, list[dict[str, Any]]]:
    """One curve per layout and per value of every other swept setting (``tp32 (output_len
    1024)``: a curve runs over concurrency only), with one entry per point in the order
    measured: throughput per GPU, the latencies of :data:`PARETO_AXES`, whether every SLO was
    met, and the point's concurrency (the curve's parameter)."""
    curves: dict[str, list[dict[str, Any]]] = {}
    every = sections(model)
    settings = [section.get("settings") or {} for section in every]
    others = sorted({key for s in settings for key in s if key != "concurrency"
                     and len({str(t.get(key)) for t in settings}) > 1})  # fmt: skip
    for section, point_settings in zip(every, settings, strict=True):
        rest = ", ".join(f"{key} {point_settings.get(key)}" for key in others)
        for entry in section["layouts"]:
            name = entry["name"]
            curve = f"{name} ({rest})" if rest else name
            point = {
                "point": section.get("id", ""),
                "concurrency": (section.get("settings") or {}).get("concurrency"),
                "output_throughput_per_gpu": per_gpu(section, name, gpus),
                "meets_slos": meets_every_slo(entry),
            }
            for metric, _ in PARETO_AXES:
                point[metric] = value(section, metric, name)
            curves.setdefault(curve, []).append(point)
    return curves
