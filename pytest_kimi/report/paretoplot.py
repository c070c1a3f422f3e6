"""The Pareto view in ``report.html`` and ``pareto.svg``: output throughput per GPU against TPOT
p95 (left) and TTFT p95 (right), one curve per layout over the workload points (by concurrency
where it is swept). Filled markers met every SLO, hollow ones did not: the layout to ship is the
highest filled marker left of the latency you can accept."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kimi.report.matrix import PARETO_AXES

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pareto_figure(pareto: Mapping[str, Sequence[Mapping[str, Any]]]) -> Figure:
    """Two panels sharing the throughput axis; each point labelled with its id (``c8``)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PARETO_AXES), figsize=(11, 3.8), sharey=True)
    for ax, (metric, label) in zip(axes, PARETO_AXES, strict=True):
        seconds = metric.startswith("ttft")
        for name, points in pareto.items():
            drawn = [p for p in _ordered(points) if _has(p, metric)]
            if not drawn:
                continue
            xs = [p[metric] / (1000.0 if seconds else 1.0) for p in drawn]
            ys = [p["output_throughput_per_gpu"] for p in drawn]
            (line,) = ax.plot(xs, ys, "-", lw=1.2, label=name)
            for x, y, p in zip(xs, ys, drawn, strict=True):
                face = line.get_color() if p["meets_slos"] else "white"
                ax.plot([x], [y], "o", ms=7, mec=line.get_color(), mfc=face)
                ax.annotate(p["point"], (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=8)  # fmt: skip
        ax.set_xlabel(f"{label} ({'s' if seconds else 'ms'})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("output tokens/s per GPU")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.suptitle("filled: every SLO met; hollow: not met", fontsize=9)
    return fig


def _ordered(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """By concurrency where every point has one, else in the order measured."""
    if all(p.get("concurrency") is not None for p in points):
        return sorted(points, key=lambda p: p["concurrency"])
    return list(points)


def _has(point: Mapping[str, Any], metric: str) -> bool:
    return point.get(metric) is not None and point["output_throughput_per_gpu"] is not None
