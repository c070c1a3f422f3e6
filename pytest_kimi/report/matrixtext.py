"""The set-up, the verdict table and the Pareto data as Markdown lines (``comparison.md``);
report.html renders the same values (:mod:`pytest_kimi.report.html`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flag_text(flags: Mapping[str, Any]) -> str:
    """Flags as they are typed: ``--chunked-prefill-size 4096 --disable-radix-cache``."""
    return " ".join(f"--{name}" if value is True else f"--{name} {value}"
                    for name, value in flags.items())  # fmt: skip


def setup_lines(setup: Mapping[str, Any]) -> list[str]:
    """``## Set-up``: model, hardware, dataset, workload, tools, then a row per layout with
    what it changes, and the flags every layout shares."""
    if not setup:
        return []
    data = setup.get("dataset") or {}
    lines = ["## Set-up", ""]
    lines.append(f"- Model: `{setup.get('model')}` ({setup.get('backend')} backend, cluster "
                 f"`{setup.get('cluster')}`)")  # fmt: skip
    for line in setup.get("hardware") or ["nodes not described (attached to an endpoint)"]:
        lines.append(f"- Hardware: {line}")
    lines.append(f"- Dataset: `{data.get('path')}` (sha256 `{data.get('sha256')}`), "
                 f"SPEED-Bench config {data.get('speedbench_config')}, category "
                 f"{data.get('category') or 'all'}, prompts {data.get('prompt')}; "
                 f"prompts sha256 `{data.get('prompts_sha256')}`")  # fmt: skip
    workload = data.get("workload") or {}
    lines.append("- Workload: " + ", ".join(f"{k} {v}" for k, v in workload.items()))
    for point, entry in (data.get("points") or {}).items():
        lines.append(f"  - point `{point}`: config {entry.get('speedbench_config')}, prompts "
                     f"sha256 `{entry.get('prompts_sha256')}`")  # fmt: skip
    tools = setup.get("tools") or {}
    lines.append("- Tools: " + ", ".join(f"{k} {v}" for k, v in tools.items()))
    lines += [
        "",
        "| layout | parallel | replicas | nodes | GPUs | router policy | its own server flags |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for name, entry in (setup.get("layouts") or {}).items():
        own = flag_text(entry.get("flags") or {}) or "(none: the shared flags only)"
        lines.append(
            f"| {name} | {entry.get('parallel')} | {entry.get('replicas')} | "
            f"{entry.get('nodes')} | {entry.get('gpus')} | {entry.get('router_policy')} | "
            f"`{own}` |"
        )
    shared = flag_text(setup.get("shared_flags") or {}) or "(none)"
    lines += ["", f"Server flags every layout shares: `{shared}`", ""]
    return lines


def verdict_lines(
    verdicts: list[Mapping[str, Any]], max_concurrency: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """``## Verdict``: per workload point, the layouts meeting every SLO and the best of them
    by output throughput per GPU; then the highest concurrency meeting every SLO, if searched."""
    if not verdicts:
        return []
    names = list(verdicts[0]["output_throughput_per_gpu"])
    lines = ["## Verdict", "",
             "| workload point | meet every SLO | best by output tok/s per GPU | "
             + " | ".join(f"{n} tok/s/GPU" for n in names) + " |",
             "|---|---|---|" + "---:|" * len(names)]  # fmt: skip
    for row in verdicts:
        point = row["point"] or "the workload"
        meeting = meeting_text(row)
        cells = [_per_gpu(row["output_throughput_per_gpu"].get(n)) for n in names]
        lines.append(f"| {point} | {meeting} | {best_text(row)} | " + " | ".join(cells) + " |")
    if max_concurrency:
        cells = [search_cell(max_concurrency.get(n)) for n in names]
        lines.append("| highest concurrency meeting every SLO | | | " + " | ".join(cells) + " |")
        lines += ["", "The search (--kimi-find-max-concurrency):", ""]
        lines += [f"- **{name}**: {describe_search(found)}" for name, found in
                  max_concurrency.items()]  # fmt: skip
    return [*lines, ""]


def meeting_text(row: Mapping[str, Any]) -> str:
    """The layouts meeting every SLO, and those that only undecided SLOs keep out."""
    text = ", ".join(row["meeting"]) or "none"
    if row.get("undecided"):
        text += f" (undecided: {', '.join(row['undecided'])})"
    return text


def best_text(row: Mapping[str, Any]) -> str:
    """The verdict's best layout, or why there is none."""
    if row["best"]:
        return f"**{row['best']}**"
    if row["meeting"]:
        return "n/a: GPU count unknown (see the manifests)"
    return "none meets every SLO"


def search_cell(found: Mapping[str, Any] | None) -> str:
    """The search's answer in one cell: ``5``, ``none``, ``no answer``, ``not searched``."""
    if found is None:
        return "not searched"
    if found.get("incomplete"):
        return "no answer (search stopped)"
    best = found.get("max_concurrency")
    if best is None:
        return "none"
    return f"{best} (top of range)" if found.get("capped") else str(best)


def describe_search(found: Mapping[str, Any]) -> str:
    """``16 (32 fails: ttft_p95); tried 1, 2, 4, 8, 16, 32, 24, 20, 18, 17``."""
    tried = ", ".join(str(t) for t in found.get("tried") or [])
    settings = found.get("settings") or {}
    at = f" (at {', '.join(f'{k} {v}' for k, v in settings.items())})" if settings else ""
    if found.get("incomplete"):
        return f"no answer: {found['incomplete']}; tried {tried}{at}"
    return _answer(found) + (f"; tried {tried}" if tried else "") + at


def _answer(found: Mapping[str, Any]) -> str:
    best = found.get("max_concurrency")
    text = str(best) if best is not None else "none: even the lowest fails"
    if found.get("first_failing") is not None:
        text += f" ({found['first_failing']} fails: {', '.join(found.get('failed_slos') or [])})"
    elif found.get("capped"):
        text += " (every tried level met the SLOs: the search's upper limit)"
    return text


def pareto_lines(pareto: Mapping[str, list[Mapping[str, Any]]], image: str) -> list[str]:
    """``## Pareto view``: the plot (an SVG beside this file) and its numbers."""
    if not pareto:
        return []
    lines = ["## Pareto view: throughput per GPU against latency", "",
             f"![throughput per GPU against TPOT p95 and TTFT p95]({image})", "",
             "| layout | point | concurrency | output tok/s per GPU | TPOT p95 | TTFT p95 | "
             "every SLO |", "|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, points in pareto.items():
        for p in points:
            lines.append(
                f"| {name} | {p['point']} | {p.get('concurrency') or ''} | "
                f"{_per_gpu(p['output_throughput_per_gpu'])} | {_ms(p.get('tpot_p95'))} | "
                f"{_ms(p.get('ttft_p95'))} | {'met' if p['meets_slos'] else 'not met'} |"
            )
    return [*lines, ""]


def _per_gpu(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"
