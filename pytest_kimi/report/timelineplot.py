"""The request timeline in ``report.html``: per layout, every request's send, first token and
end, with its nodes' GPU panels under it (:mod:`pytest_kimi.report.telemetryplot`).

Real SGLang names no replica per request, so the timeline does not pretend to split requests
between replicas: requests without one share a single row, labelled so, and the split is given
as what the replicas' own counters say in total (:mod:`pytest_kimi.results.replicacounters`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.textpath import TextPath

from pytest_kimi.report.telemetryplot import PANEL_HEIGHT, curves_for, draw_node
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.results.replicacounters import ReplicaCounters

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pytest_kimi.results.telemetry_stats import TelemetrySeries

Counters = Mapping[str, Mapping[str, ReplicaCounters]]
Telemetry = Mapping[str, "TelemetrySeries | None"]
UNATTRIBUTED = "all replicas (not known per request)"


def _counter_totals(counters: Mapping[str, ReplicaCounters]) -> str:
    """``replica0 20 req, replica1 20 req``: the split the replicas' counters give."""
    parts = [f"{name} {c.requests} req" for name, c in sorted(counters.items())
             if c.requests is not None]  # fmt: skip
    return ", ".join(parts)


def timeline_rows(records: Sequence[RequestRecord]) -> list[tuple[str, list[RequestRecord]]]:
    """The timeline's rows: one per replica a record names, and one, :data:`UNATTRIBUTED`, for
    the records that name none (all of them on real SGLang): never a guessed split."""
    names = sorted({r.replica or UNATTRIBUTED for r in records})
    return [
        (name, sorted((r for r in records if (r.replica or UNATTRIBUTED) == name),
                      key=lambda r: r.latency_start))
        for name in names
    ]  # fmt: skip


def timed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Measured requests with an end: what the timeline and throughput plots draw."""
    return [r for r in records if not r.warmup and r.end_time is not None]


# The timeline figure's layout, in inches. It is placed here rather than by a layout engine:
# with a GPU panel per node (and a power axis on each) constrained layout and a trimmed
# bounding box drew the figure three times, seconds per report.
TIMELINE_WIDTH, TIMELINE_HEIGHT = 9.0, 2.6
TITLE_SPACE, NODE_TITLE_SPACE, XLABEL_SPACE, PANEL_GAP = 0.6, 0.3, 0.55, 0.15
RIGHT_SPACE = 0.65  # the power axis' tick labels


def timeline_figure(
    records: Mapping[str, Sequence[RequestRecord]],
    time_scale: float,
    counters: Counters,
    telemetry: Telemetry,
) -> Figure:
    """One timeline per layout; under it, where its GPUs were sampled, one small panel per
    node on the same x axis (:mod:`pytest_kimi.report.telemetryplot`)."""
    layouts = [name for name, recs in records.items() if timed(recs)]
    curves = {}
    for name in layouts:
        series = telemetry.get(name)
        if series is not None and series.samples:
            first = min(r.latency_start for r in timed(records[name]))
            curves[name] = curves_for(series, first)
    blocks = [_block_height(len(curves.get(name, {}))) for name in layouts]
    height = sum(blocks)
    labels = [rep for name in layouts for rep, _ in timeline_rows(timed(records[name]))]
    labels += [node for name in layouts for node in curves.get(name, {})]
    left = min(0.4 * TIMELINE_WIDTH, max(0.9, 0.45 + max(map(_label_width, labels))))
    fig = plt.figure(figsize=(TIMELINE_WIDTH, height))
    x0, width = left / TIMELINE_WIDTH, 1 - (left + RIGHT_SPACE) / TIMELINE_WIDTH

    def axes(top: float, tall: float, **kwargs: Any) -> Axes:
        """An axes whose top edge is ``top`` inches below the figure's top."""
        return fig.add_axes((x0, (height - top - tall) / height, width, tall / height), **kwargs)

    top = 0.0
    for name, block in zip(layouts, blocks, strict=True):
        ax = axes(top + TITLE_SPACE, TIMELINE_HEIGHT)
        _draw_timeline(ax, name, timed(records[name]), time_scale, counters)
        panel_top = top + TITLE_SPACE + TIMELINE_HEIGHT + NODE_TITLE_SPACE
        node_axes = []
        for i, (node, curve) in enumerate(curves.get(name, {}).items()):
            node_ax = axes(panel_top + i * (PANEL_HEIGHT + PANEL_GAP), PANEL_HEIGHT, sharex=ax)
            draw_node(node_ax, node, curve, legend=i == 0)
            node_axes.append(node_ax)
        if node_axes:
            ax.set_xlabel("")
            for other in [ax, *node_axes[:-1]]:
                other.tick_params(labelbottom=False)
            node_axes[0].set_title(f"{name}: GPUs per node (band: min-max over the node's "
                                   "GPUs)", fontsize=9)  # fmt: skip
            node_axes[-1].set_xlabel("cluster time since the first request (s)")
        ax.set_xlim(*_span(timed(records[name]), time_scale))
        top += block
    return fig


def _label_width(text: str, points: float = 8.0) -> float:
    """Inches that ``text`` takes at ``points`` in the default font (no figure drawn)."""
    return TextPath((0, 0), text, size=points).get_extents().width / 72.0


def _block_height(nodes: int) -> float:
    """One layout's share of the timeline figure, in inches: its timeline, its node panels."""
    panels = NODE_TITLE_SPACE + nodes * PANEL_HEIGHT + (nodes - 1) * PANEL_GAP if nodes else 0
    return TITLE_SPACE + TIMELINE_HEIGHT + panels + XLABEL_SPACE


def _span(measured: Sequence[RequestRecord], time_scale: float) -> tuple[float, float]:
    """The timeline's x range (the GPU panels, sampled before and after, are clipped to it)."""
    start = min(r.latency_start for r in measured)
    end = max((r.end_time - start) * time_scale for r in measured if r.end_time is not None)
    pad = 0.02 * max(end, 1e-9)
    return -pad, end + pad


def _draw_timeline(
    ax: Axes,
    name: str,
    measured: Sequence[RequestRecord],
    time_scale: float,
    counters: Counters,
) -> None:
    start = min(r.latency_start for r in measured)
    y = 0
    ticks = []
    for rep, rows in timeline_rows(measured):
        for r in rows:
            send = (r.latency_start - start) * time_scale
            end = (r.end_time - start) * time_scale
            first = (r.first_token_time - start) * time_scale if r.first_token_time else end
            color = "tab:red" if not r.success else "tab:blue"
            ax.plot([send, first], [y, y], color="tab:orange", lw=3)
            ax.plot([first, end], [y, y], color=color, lw=3)
            y += 1
        ticks.append((y - len(rows) / 2, rep))
        y += 2
    ax.set_yticks([t for t, _ in ticks], [label for _, label in ticks], fontsize=8)
    title = f"{name}: waiting for first token (orange), decoding (blue)"
    totals = _counter_totals(counters.get(name, {}))
    if totals:  # two title lines at most: the caption lists them all
        line = f"per replica, by its /metrics counters (not per request): {totals}"
        title += "\n" + textwrap.shorten(line, width=95, placeholder=" ...")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("cluster time since the first request (s)")


def timeline_caption(
    records: Mapping[str, Sequence[RequestRecord]], counters: Counters, telemetry: Telemetry
) -> str:
    """The timeline's caption: its rows, the replicas' own split, its GPU panels."""
    caption = ("every request: send, first token, end; one row per replica where the "
               "response named it, otherwise one row for all replicas")  # fmt: skip
    totals = [f"{name}: {_counter_totals(c)}" for name, c in counters.items()
              if _counter_totals(c)]  # fmt: skip
    if totals:
        caption += (". Requests per replica by each replica's /metrics counters "
                    "(attribution by counters, not per request): ")  # fmt: skip
        caption += "; ".join(totals)
    return caption + ". " + _telemetry_caption(records, telemetry)


def _telemetry_caption(records: Mapping[str, Sequence[RequestRecord]], telemetry: Telemetry) -> str:
    """What the GPU panels show, and which layouts have none (their notes say why)."""
    sampled = [name for name in records if (s := telemetry.get(name)) is not None and s.samples]
    text = ""
    if sampled:
        text = ("Under each timeline, per node: GPU utilisation (line: mean over the node's "
                "GPUs, band: min-max) and the node's total power (dashed, right axis), from "
                "nvidia-smi samples on the same cluster-time axis")  # fmt: skip
    missing = [name for name in records if name not in sampled]
    if missing:
        text += ("; " if text else "") + "no GPU telemetry for " + ", ".join(missing)
        text += " (see the notes)"
    return text
