"""``report.html``: one self-contained page (plots inline as SVG) to read a comparison at a glance.

Plots, all in cluster time: TTFT / TPOT / E2E CDFs per layout (medians hide tails; a CDF shows
them), a per-request timeline (send, first token, end: queueing and prefill interference are
visible), and output throughput over time. The table, SLO verdicts and notes come from the same
report model as ``comparison.md``.

Real SGLang names no replica per request, so the timeline does not pretend to split requests
between replicas: requests without one share a single row, labelled so, and the split is given
as what the replicas' own counters say in total (:mod:`pytest_kimi.results.replicacounters`).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.textpath import TextPath

from pytest_kimi.report.categories import CAPTION as CATEGORY_CAPTION
from pytest_kimi.report.categories import HEADER as CATEGORY_HEADER
from pytest_kimi.report.categories import category_rows
from pytest_kimi.report.comparison import (
    backend_label,
    cases,
    point_title,
    sections,
    table_rows,
)
from pytest_kimi.report.matrixtext import best_text, describe_search, flag_text, search_cell
from pytest_kimi.report.paretoplot import pareto_figure
from pytest_kimi.report.telemetryplot import PANEL_HEIGHT, curves_for, draw_node
from pytest_kimi.report.trendplot import trend_caption, trend_figure
from pytest_kimi.results.metrics import per_request_ms
from pytest_kimi.results.pdstages import CAPTION as PD_CAPTION
from pytest_kimi.results.pdstages import ttft_tables
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.results.replicacounters import ReplicaCounters

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from pytest_kimi.results.telemetry_stats import TelemetrySeries

Counters = Mapping[str, Mapping[str, ReplicaCounters]]
Telemetry = Mapping[str, "TelemetrySeries | None"]
UNATTRIBUTED = "all replicas (not known per request)"

PLOT_IDS = ("cdf-ttft", "cdf-tpot", "cdf-e2e", "timeline", "throughput")
"""The plots of every report; a sweep's report opens them with ``pareto``."""

_TEMPLATE = jinja2.Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>pytest-kimi: {{ model.run_id }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 14px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
table.text td:nth-child(-n+3), table.text th { text-align: left; }
.pass { color: #176f2c; } .fail { color: #b00020; font-weight: bold; }
.incomplete { border: 2px solid #b00020; padding: 0 1em; margin: 1em 0; background: #fff4f4; }
figure { margin: 1.5em 0; } figcaption { font-size: 13px; color: #555; }
</style></head><body>
<h1>Layout comparison: {{ model.run_id }}</h1>
{% if not model.get("complete", True) %}<div class="incomplete"><b>INCOMPLETE RUN</b>: these
figures are not the full answer.<ul>{% for reason in model.incomplete %}<li>{{ reason }}</li>
{% endfor %}</ul></div>{% endif %}
<p>Backend: {{ backend }}. Reference layout: <code>{{ model.reference }}</code>; deltas are
relative to it. Latency deltas carry a 95% bootstrap interval; <code>*</code> marks one that
excludes zero.</p>
{% if setup %}<h2>Set-up</h2><ul>
<li>Model: <code>{{ setup.model }}</code> ({{ setup.backend }} backend, cluster
<code>{{ setup.cluster }}</code>)</li>
{% for line in setup.hardware %}<li>Hardware: {{ line }}</li>{% endfor %}
<li>Dataset: <code>{{ setup.dataset.path }}</code> (sha256 <code>{{ setup.dataset.sha256 }}</code>),
SPEED-Bench config {{ setup.dataset.speedbench_config }}, category
{{ setup.dataset.category or 'all' }}, prompts {{ setup.dataset.prompt }}; prompts sha256
<code>{{ setup.dataset.prompts_sha256 }}</code></li>
<li>Workload: {{ listed(setup.dataset.workload) }}</li>
<li>Tools: {{ listed(setup.tools) }}</li>
</ul>
<table class="text"><thead><tr><th>layout</th><th>parallel</th><th>replicas</th><th>nodes</th>
<th>GPUs</th><th>router policy</th><th>its own server flags</th></tr></thead><tbody>
{% for name, lay in setup.layouts.items() %}<tr><td>{{ name }}</td><td>{{ lay.parallel }}</td>
<td>{{ lay.replicas }}</td><td>{{ lay.nodes }}</td><td>{{ lay.gpus }}</td>
<td>{{ lay.router_policy }}</td>
<td style="text-align:left"><code>{{ own_flags[name] }}</code></td></tr>
{% endfor %}</tbody></table>
<p>Server flags every layout shares: <code>{{ shared_flags }}</code></p>{% endif %}
{% for sec in sections %}{% if sec.title %}<h2 id="point-{{ sec.id }}">Workload point
{{ sec.title }}</h2>{% endif %}
<table><thead><tr>{% for h in sec.header %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in sec.body %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</tbody></table>
<h{{ 3 if sec.title else 2 }}>SLO verdicts</h{{ 3 if sec.title else 2 }}><ul>
{% for layout in sec.layouts %}{% if layout.error %}
<li><b>{{ layout.name }}</b>: not measured: {{ layout.error.splitlines()[0] }}</li>
{% else %}{% for s in layout.slo %}
<li><b>{{ layout.name }}</b> {{ s.name }}:
<span class="{{ 'pass' if s.passed else 'fail' }}">{{ 'PASS' if s.passed else 'FAIL' }}</span>
</li>{% endfor %}{% endif %}{% endfor %}
</ul>{% if sec.categories %}<h{{ 3 if sec.title else 2 }}>Per SPEED-Bench category</h{{ 3 if
sec.title else 2 }}><p>{{ category_caption }}</p>
<table class="text"><thead><tr>{% for h in category_header %}<th>{{ h }}</th>{% endfor %}
</tr></thead><tbody>{% for row in sec.categories %}<tr>{% for c in row %}
<td{% if loop.index > 2 %} style="text-align:right"{% endif %}>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>{% endif %}
{% if sec.pd %}<h{{ 3 if sec.title else 2 }}>Prefill/decode disaggregation: where TTFT goes
</h{{ 3 if sec.title else 2 }}><p>{{ pd_caption }}</p>{% for t in sec.pd %}<p><b>{{ t.name }}</b>
</p><table class="text"><thead><tr><th>part</th><th>mean</th><th>share of TTFT</th></tr>
</thead><tbody>{% for part, ms, share in t.rows %}<tr><td>{{ part }}</td>
<td style="text-align:right">{{ ms }}</td><td style="text-align:right">{{ share }}</td></tr>
{% endfor %}</tbody></table>{% if t.against %}<p>Against the unified layouts of its sides'
shapes: {{ t.against }}.</p>{% endif %}<p>{{ t.kv }}</p>{% endfor %}{% endif %}{% endfor %}
{% if pareto %}<h2>Pareto view: throughput per GPU against latency</h2>
<figure id="{{ pareto.id }}">{{ pareto.svg }}<figcaption>{{ pareto.caption }}</figcaption>
</figure>{% endif %}
{% if verdicts %}<h2 id="verdict">Verdict</h2>
<table class="text"><thead><tr><th>workload point</th><th>meet every SLO</th>
<th>best by output tok/s per GPU</th>{% for n in verdict_names %}<th>{{ n }} tok/s/GPU</th>
{% endfor %}</tr></thead><tbody>
{% for row in verdicts %}<tr><td>{{ row.point or "the workload" }}</td>
<td>{{ row.meeting | join(", ") or "none" }}</td>
<td>{% if row.best %}<b>{{ row.best }}</b>{% else %}<span class="fail">{{ best_text(row) }}
</span>{% endif %}</td>
{% for n in verdict_names %}<td>{{ per_gpu(row.output_throughput_per_gpu[n]) }}</td>
{% endfor %}</tr>
{% endfor %}{% if searches %}<tr><td>highest concurrency meeting every SLO</td><td></td><td></td>
{% for n in verdict_names %}<td>{{ search_cell(model.max_concurrency.get(n)) }}</td>{% endfor %}
</tr>{% endif %}</tbody></table>
{% if searches %}<p>The search (--kimi-find-max-concurrency):</p><ul>
{% for name, text in searches.items() %}<li><b>{{ name }}</b>: {{ text }}</li>{% endfor %}
</ul>{% endif %}{% endif %}
{% if trends %}<h2 id="trend">Trend across the history</h2>
{% for t in trends %}<figure id="{{ t.id }}">{{ t.svg }}<figcaption>{{ t.caption }}</figcaption>
</figure>{% endfor %}{% endif %}
{% if notes %}<h2>Data quality and notes</h2><ul>
{% for name, note in notes %}<li><b>{{ name }}</b>: {{ note }}</li>{% endfor %}</ul>{% endif %}
<h2>Plots</h2>
{% for plot in plots %}<figure id="{{ plot.id }}">{{ plot.svg }}
<figcaption>{{ plot.caption }}</figcaption></figure>
{% endfor %}
</body></html>
""",
    autoescape=True,
)


def svg(fig: plt.Figure, *, trim: bool = True) -> str:
    """The figure as inline SVG markup (closed afterwards), trimmed to what it draws unless
    it is laid out already (``trim=False``, or a layout engine): trimming draws it twice."""
    buffer = io.StringIO()
    trim = trim and fig.get_layout_engine() is None
    fig.savefig(buffer, format="svg", bbox_inches="tight" if trim else None)
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


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


def _timed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Measured requests with an end: what the timeline and throughput plots draw."""
    return [r for r in records if not r.warmup and r.end_time is not None]


# The timeline figure's layout, in inches. It is placed here rather than by a layout engine:
# with a GPU panel per node (and a power axis on each) constrained layout and a trimmed
# bounding box drew the figure three times, seconds per report.
TIMELINE_WIDTH, TIMELINE_HEIGHT = 9.0, 2.6
TITLE_SPACE, NODE_TITLE_SPACE, XLABEL_SPACE, PANEL_GAP = 0.6, 0.3, 0.55, 0.15
RIGHT_SPACE = 0.65  # the power axis' tick labels


def _timeline_plot(
    records: Mapping[str, Sequence[RequestRecord]],
    time_scale: float,
    counters: Counters,
    telemetry: Telemetry,
) -> str:
    """One timeline per layout; under it, where its GPUs were sampled, one small panel per
    node on the same x axis (:mod:`pytest_kimi.report.telemetryplot`)."""
    layouts = [name for name, recs in records.items() if _timed(recs)]
    curves = {}
    for name in layouts:
        series = telemetry.get(name)
        if series is not None and series.samples:
            first = min(r.latency_start for r in _timed(records[name]))
            curves[name] = curves_for(series, first)
    blocks = [_block_height(len(curves.get(name, {}))) for name in layouts]
    height = sum(blocks)
    labels = [rep for name in layouts for rep, _ in timeline_rows(_timed(records[name]))]
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
        _draw_timeline(ax, name, _timed(records[name]), time_scale, counters)
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
        ax.set_xlim(*_span(_timed(records[name]), time_scale))
        top += block
    return svg(fig, trim=False)


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


def render_html(
    model: dict[str, Any],
    records: Mapping[str, Sequence[RequestRecord]],
    counters: Counters | None = None,
    telemetry: Telemetry | None = None,
) -> str:
    """The page for ``model`` (from build_comparison), each layout's records and, where known,
    each layout's per-replica counters (``LayoutResult.replica_counters``) and GPU samples
    (``LayoutResult.telemetry_series``)."""
    scale = model["time_scale"]
    samples = {name: per_request_ms(recs, time_scale=scale) for name, recs in records.items()}
    plots = []
    pareto = None
    if model.get("pareto"):
        pareto = {"id": "pareto", "svg": svg(pareto_figure(model["pareto"])),
                  "caption": "the Pareto view: output throughput per GPU against TPOT p95 and "
                  "TTFT p95, one curve per layout over the workload points; filled markers "
                  "met every SLO"}  # fmt: skip
    trends = [
        {"id": f"trend-{t['metric']}", "svg": svg(trend_figure(t)), "caption": trend_caption(t)}
        for t in model.get("trends") or []
    ]
    for key, label, unit in (("ttft", "TTFT", "s"), ("tpot", "TPOT", "ms"), ("e2e", "E2E", "s")):
        cdf = _cdf_plot({n: s[key] for n, s in samples.items()}, label, unit)
        plots.append({"id": f"cdf-{key}", "svg": cdf, "caption": f"{label} CDF per layout"})
    if any(_timed(recs) for recs in records.values()):  # a run stopped at warm-up has none
        caption = ("every request: send, first token, end; one row per replica where the "
                   "response named it, otherwise one row for all replicas")  # fmt: skip
        totals = [f"{name}: {_counter_totals(c)}" for name, c in (counters or {}).items()
                  if _counter_totals(c)]  # fmt: skip
        if totals:
            caption += (". Requests per replica by each replica's /metrics counters "
                        "(attribution by counters, not per request): ")  # fmt: skip
            caption += "; ".join(totals)
        caption += ". " + _telemetry_caption(records, telemetry or {})
        timeline = _timeline_plot(records, scale, counters or {}, telemetry or {})
        plots.append({"id": "timeline", "svg": timeline, "caption": caption})
        plots.append({"id": "throughput", "svg": _throughput_plot(records, scale),
                      "caption": "output throughput over time"})  # fmt: skip
    shown = []
    for section in sections(model):
        header, body = table_rows(section)
        shown.append({"id": section.get("id", ""), "title": point_title(section),
                      "header": header, "body": body, "layouts": section["layouts"],
                      "categories": category_rows(section),
                      "pd": ttft_tables(section)})  # fmt: skip
    notes = [(case, n) for case, lay in cases(model) for n in lay["notes"]]
    setup = model.get("setup") or {}
    verdicts = model.get("verdicts") or []
    own_flags = {
        name: flag_text(lay.get("flags") or {}) or "(none: the shared flags only)"
        for name, lay in (setup.get("layouts") or {}).items()
    }
    searches = {
        name: describe_search(found)
        for name, found in (model.get("max_concurrency") or {}).items()
    }
    return _TEMPLATE.render(
        model=model,
        backend=backend_label(model),
        setup=setup,
        own_flags=own_flags,
        shared_flags=flag_text(setup.get("shared_flags") or {}) or "(none)",
        verdicts=verdicts,
        verdict_names=list(verdicts[0]["output_throughput_per_gpu"]) if verdicts else [],
        per_gpu=lambda v: "n/a" if v is None else f"{v:.2f}",
        best_text=best_text,
        search_cell=search_cell,
        listed=lambda pairs: ", ".join(f"{k} {v}" for k, v in (pairs or {}).items()),
        searches=searches,
        sections=shown,
        category_header=CATEGORY_HEADER,
        category_caption=CATEGORY_CAPTION,
        pd_caption=PD_CAPTION,
        notes=notes,
        plots=[_markup(p) for p in plots],
        pareto=_markup(pareto) if pareto else None,
        trends=[_markup(t) for t in trends],
    )


def _markup(plot: dict[str, Any]) -> dict[str, Any]:
    """A plot whose SVG goes into the page as markup (we drew it), not as escaped text."""
    return {**plot, "svg": jinja2.utils.markupsafe.Markup(plot["svg"])}
