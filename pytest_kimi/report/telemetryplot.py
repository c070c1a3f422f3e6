"""The GPU panels under a layout's request timeline in ``report.html``: per node, its GPUs'
utilisation (mean, with the min-max band over the node's GPUs) and its total power, on the
timeline's own x axis (cluster seconds since the first measured request)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pytest_kimi.results.telemetry_stats import NodeCurve, TelemetrySeries, node_curves

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PANEL_HEIGHT = 0.8  # inches per node
UTIL_COLOR, POWER_COLOR = "tab:green", "tab:purple"


def curves_for(series: TelemetrySeries, first_send_clock: float) -> dict[str, NodeCurve]:
    """Each node's curve, shifted so 0 is the first measured request (the timeline's 0)."""
    return node_curves(series, shift=series.to_t(first_send_clock))


def draw_node(ax: Axes, node: str, curve: NodeCurve, *, legend: bool) -> None:
    """Utilisation on the left axis (0-100 %), the node's total power on a right one."""
    t = np.asarray(curve.t)
    ax.fill_between(t, curve.util_min, curve.util_max, color=UTIL_COLOR, alpha=0.2, lw=0)
    ax.plot(t, curve.util_mean, color=UTIL_COLOR, lw=1.5, marker=".", ms=3, label="util % (mean)")
    ax.set_ylim(0, 105)
    ax.set_yticks([0, 50, 100])
    ax.set_ylabel(node, fontsize=8, rotation=0, ha="right", va="center")
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    power = np.asarray(curve.power_w, dtype=float)
    if np.isfinite(power).any():
        twin = ax.twinx()
        twin.plot(t, power, color=POWER_COLOR, lw=1, ls="--", label="power W (node)")
        twin.set_ylim(0, max(1.0, float(np.nanmax(power))) * 1.1)
        twin.tick_params(labelsize=7, colors=POWER_COLOR)
        if legend:
            handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
            ax.legend(handles=handles, fontsize=7, loc="upper right", ncols=2)
    elif legend:
        ax.legend(fontsize=7, loc="upper right")
