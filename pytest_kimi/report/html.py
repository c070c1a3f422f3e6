"""``report.html``: one self-contained page (plots inline as SVG) to read a comparison at a glance.

The page's template and what it is filled with. The table, SLO verdicts and notes come from the
same report model as ``comparison.md``; the plots (CDFs, the request timeline, throughput over
time, all in cluster time) are :mod:`pytest_kimi.report.plots`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from pytest_kimi.report import betweenruns, categories, turns
from pytest_kimi.report.comparison import (
    backend_label,
    cases,
    interval_text,
    point_title,
    sections,
    table_rows,
)
from pytest_kimi.report.matrixtext import (
    best_text,
    describe_search,
    flag_text,
    meeting_text,
    search_cell,
)
from pytest_kimi.report.paretoplot import pareto_figure
from pytest_kimi.report.plots import request_plots, svg
from pytest_kimi.report.timelineplot import Counters, Telemetry
from pytest_kimi.report.trendplot import trend_caption, trend_figure
from pytest_kimi.results.pdstages import CAPTION as PD_CAPTION
from pytest_kimi.results.pdstages import ttft_tables
from pytest_kimi.results.records import RequestRecord

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
.undecided { color: #8a5a00; font-weight: bold; }
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
</tbody></table>{% if sec.runs %}<p>Repeated (--kimi-repeat: {{ sec.runs }}): the figures pool
each layout's runs' requests (throughputs and duration: the runs' means), and the deltas'
bootstrap intervals rest on the pooled requests; "Between runs" below has the spread.</p>
{% endif %}
<h{{ 3 if sec.title else 2 }}>SLO verdicts</h{{ 3 if sec.title else 2 }}><ul>
{% for layout in sec.layouts %}{% if layout.error %}
<li><b>{{ layout.name }}</b>: not measured: {{ layout.error.splitlines()[0] }}</li>
{% else %}{% for s in layout.slo %}
<li><b>{{ layout.name }}</b> {{ s.name }}: {% set o = s.outcome or ('passed' if s.passed
else 'failed') %}<span class="{{ {'passed': 'pass', 'failed': 'fail'}.get(o, 'undecided') }}">{{
{'passed': 'PASS', 'failed': 'FAIL'}.get(o, 'UNDECIDED') }}</span>{% if s.interval %}
({{ interval(s) }}){% endif %}{% if s.why %}: {{ s.why }}{% endif %}
</li>{% endfor %}{% endif %}{% endfor %}
</ul>{% for split in sec.splits %}<h{{ 3 if sec.title else 2 }}>{{ split.title }}</h{{ 3 if
sec.title else 2 }}><p>{{ split.caption }}</p>
<table class="text"><thead><tr>{% for h in split.header %}<th>{{ h }}</th>{% endfor %}
</tr></thead><tbody>{% for row in split.rows %}<tr>{% for c in row %}
<td{% if loop.index > 2 %} style="text-align:right"{% endif %}>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>{% endfor %}
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
<td>{{ meeting_text(row) }}</td>
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


def render_html(
    model: dict[str, Any],
    records: Mapping[str, Sequence[RequestRecord]],
    counters: Counters | None = None,
    telemetry: Telemetry | None = None,
) -> str:
    """The page for ``model`` (from build_comparison), each layout's records and, where known,
    each layout's per-replica counters (``LayoutResult.replica_counters``) and GPU samples
    (``LayoutResult.telemetry_series``)."""
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
    plots = request_plots(records, model["time_scale"], counters or {}, telemetry or {})
    shown = []
    for section in sections(model):
        header, body = table_rows(section)
        shown.append({"id": section.get("id", ""), "title": point_title(section),
                      "header": header, "body": body, "layouts": section["layouts"],
                      "splits": _splits(section), "runs": betweenruns.runs_words(section),
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
        meeting_text=meeting_text,
        search_cell=search_cell,
        interval=interval_text,
        listed=lambda pairs: ", ".join(f"{k} {v}" for k, v in (pairs or {}).items()),
        searches=searches,
        sections=shown,
        pd_caption=PD_CAPTION,
        notes=notes,
        plots=[_markup(p) for p in plots],
        pareto=_markup(pareto) if pareto else None,
        trends=[_markup(t) for t in trends],
    )


def _markup(plot: dict[str, Any]) -> dict[str, Any]:
    """A plot whose SVG goes into the page as markup (we drew it), not as escaped text."""
    return {**plot, "svg": jinja2.utils.markupsafe.Markup(plot["svg"])}


def _splits(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's tables by SPEED-Bench category and by session turn, those with rows."""
    tables = [
        ("Between runs", betweenruns.CAPTION, betweenruns.HEADER,
         betweenruns.between_rows(section)),
        ("Per SPEED-Bench category", categories.CAPTION, categories.HEADER,
         categories.category_rows(section)),
        ("Per session turn", turns.CAPTION, turns.HEADER, turns.turn_rows(section)),
    ]  # fmt: skip
    return [{"title": title, "caption": caption, "header": header, "rows": rows}
            for title, caption, header, rows in tables if rows]  # fmt: skip
