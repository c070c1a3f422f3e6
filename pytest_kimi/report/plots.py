"""The plots of ``report.html``, all in cluster time, and :func:`svg`, which puts a figure inline.

TTFT / TPOT / E2E CDFs per layout (medians hide tails; a CDF shows them), a per-request
timeline (send, first token, end: queueing and prefill interference are visible,
:mod:`pytest_kimi.report.timelineplot`), and output throughput over time.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from pytest_kimi.report.timelineplot import (
    Counters,
    Telemetry,
    timed,
    timeline_caption,
    timeline_figure,
)
from pytest_kimi.results.metrics import per_request_ms
from pytest_kimi.results.records import RequestRecord

PLOT_IDS = ("cdf-ttft", "cdf-tpot", "cdf-e2e", "timeline", "throughput")
"""The plots of every report; a sweep's report opens them with ``pareto``."""


def svg(fig: plt.Figure, *, trim: bool = True) -> str:
    """The figure as inline SVG markup (closed afterwards), trimmed to what it draws unless
    it is laid out already (``trim=False``, or a layout engine): trimming draws it twice."""
    buffer = io.StringIO()
    trim = trim and fig.get_layout_engine() is None
    fig.savefig(buffer, format="svg", bbox_inches="tight" if trim else None)
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def request_plots(
    records: Mapping[str, Sequence[RequestRecord]],
    time_scale: float,
    counters: Counters,
    telemetry: Telemetry,
) -> list[dict[str, Any]]:
    """The plots drawn from the layouts' records (:data:`PLOT_IDS`): ``id``, ``svg``,
    ``caption`` each; only the CDFs when no request was measured."""
    samples = {name: per_request_ms(recs, time_scale=time_scale) for name, recs in records.items()}
    plots = []
    for key, label, unit in (("ttft", "TTFT", "s"), ("tpot", "TPOT", "ms"), ("e2e", "E2E", "s")):
        cdf = _cdf_plot({n: s[key] for n, s in samples.items()}, label, unit)
        plots.append({"id": f"cdf-{key}", "svg": cdf, "caption": f"{label} CDF per layout"})
    if any(timed(recs) for recs in records.values()):  # a run stopped at warm-up has none
        caption = timeline_caption(records, counters, telemetry)
        timeline = svg(timeline_figure(records, time_scale, counters, telemetry), trim=False)
        plots.append({"id": "timeline", "svg": timeline, "caption": caption})
        plots.append({"id": "throughput", "svg": _throughput_plot(records, time_scale),
                      "caption": "output throughput over time"})  # fmt: skip
    return plots


def _cdf_plot(samples: Mapping[str, list[float]], metric: str, unit: str) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, values in samples.items():
        if values:
            xs = np.sort(np.asarray(values)) / (1000.0 if unit == "s" else 1.0)
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=name)
    ax.set_xlabel(f"{metric} ({unit})")
    ax.set_ylabel("share of requests")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no successful requests", ha="center", transform=ax.transAxes)
    return svg(fig)


def _throughput_plot(records: Mapping[str, Sequence[RequestRecord]], time_scale: float) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, recs in records.items():
        measured = [r for r in recs if not r.warmup]
        if not measured:
            continue
        start = min(r.latency_start for r in measured)
        times = [(c.time - start) * time_scale for r in measured for c in r.chunks]
        tokens = [c.tokens for r in measured for c in r.chunks]
        if not times:
            continue
        width = max(1.0, max(times) / 60)  # about 60 bins over the run
        edges = np.arange(0, max(times) + width, width)
        counts, _ = np.histogram(times, bins=edges, weights=tokens)
        ax.plot(edges[:-1], counts / width, label=name)
    ax.set_xlabel("cluster time since the first request (s)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.legend()
    return svg(fig)
