"""The trend view in ``report.html``: one plot per gated metric across the history's runs, a
line per layout (and workload point). Each level the change-point detection found is drawn as
its median with the noise band around it (K_NOISE x the run-to-run spread); a change point is a
dashed line at the run where the level moved, labelled with the step; tonight is the last,
larger marker. Data: the model's ``trends``
(:func:`pytest_kimi.judge.history.trend.report_trends`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_kimi.results import catalogue

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def trend_figure(trend: Mapping[str, Any]) -> Figure:
    """One metric's plot; x is the run's place in the history (its date below it)."""
    import matplotlib.pyplot as plt

    metric = catalogue.metric(trend["metric"])
    seconds = trend["metric"].startswith(("ttft", "e2e"))
    scale = 1000.0 if seconds else 1.0
    fig, ax = plt.subplots(figsize=(11, 3.4))
    longest = max((data["finished_at"] for data in trend["cases"].values()), key=len)
    for case, data in trend["cases"].items():
        values = [v / scale for v in data["values"]]
        shift = len(longest) - len(values)  # every case ends at this run, on the right
        xs = [shift + n for n in range(len(values))]
        (line,) = ax.plot(xs, values, "o-", ms=3.5, lw=1.0, label=case)
        colour = line.get_color()
        ax.plot([xs[-1]], [values[-1]], "o", ms=8, color=colour, mec="black")  # tonight
        for level in data["levels"]:
            span = (shift + level["start"] - 0.4, shift + level["end"] - 0.6)
            ax.hlines(level["level"] / scale, *span, colors=colour, linestyles="-", lw=0.8)
            if level["band"]:
                low, high = (b / scale for b in level["band"])
                ax.fill_between(span, low, high, color=colour, alpha=0.12, lw=0)
        for change in data["changes"]:
            x = shift + change["index"] - 0.5
            ax.axvline(x, color=colour, ls="--", lw=1.0)
            label = f"{change['change']:+.0%} ({change['direction']})"
            ax.annotate(label, (x, values[change["index"]]), textcoords="offset points",
                        xytext=(4, 6), fontsize=8, color=colour)  # fmt: skip
    step = max(1, len(longest) // 12)
    ax.set_xticks(range(0, len(longest), step))
    days = {at[:10] for at in longest}
    short = [at[5:10] if len(days) == len(longest) else at[5:16].replace("T", " ")
             for at in longest[::step]]  # fmt: skip
    ax.set_xticklabels(short, fontsize=8)
    unit = "s" if seconds else metric.unit
    ax.set_ylabel(f"{trend['metric']} ({unit})")
    ax.set_xlabel("run in the history (date finished); the last, large marker: this run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def trend_caption(trend: Mapping[str, Any]) -> str:
    """What the plot shows, in words: per case the runs, the noise and the change points."""
    parts = []
    for case, data in trend["cases"].items():
        noise = "noise not known yet" if data["noise"] is None else f"noise {data['noise']:.1%}"
        changes = "; ".join(
            f"{c['change']:+.1%} ({c['direction']}) at run {c['run_id']}" for c in data["changes"]
        )
        found = f"change points: {changes}" if changes else "no change point"
        parts.append(f"{case}: {len(data['values'])} runs, {noise}, limit {data['limit']:.1%}, "
                     f"{found}")  # fmt: skip
    return (f"{trend['metric']} across the history (shaded: each level's noise band; dashed: "
            f"a change point): " + "; ".join(parts))  # fmt: skip
