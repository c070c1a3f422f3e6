"""A finished run as history rows: what identifies it, and each (layout, point) it measured.

The figures are the ones the report and the baseline use (catalogue names, cluster time), the
samples the per-request latencies a bootstrap interval needs. Each result also carries its
experiment: the workload settings, prompts and timing conventions that make two runs
comparable. A series is read per experiment, so tonight's concurrency-8 run is never judged
against last week's concurrency-32 one; what the cluster file, the versions or the code
changed is kept per run, to explain a change, not to split the series.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pytest_kimi.judge.baseline import metrics_of
from pytest_kimi.judge.history.store import RUNS, ResultRecord, RunRecord

if TYPE_CHECKING:
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.points import Point
    from pytest_kimi.results.layout import LayoutResult


def run_record(
    inputs: Inputs,
    run_id: str,
    incomplete: Sequence[str],
    tools: Mapping[str, str],
    commit: str | None,
    now: datetime | None = None,
) -> RunRecord:
    """The run's identity: its id and time, the code under test's commit (when given), the
    versions the nodes reported (``tools`` of the report's set-up: the servers' SGLang, the
    router on its node) and the cluster file's SHA-256 as it was read."""
    when = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    return RunRecord(
        run_id=run_id,
        finished_at=when,
        cluster=inputs.cluster.name,
        cluster_sha256=inputs.cluster.sha256,
        backend=inputs.backend,
        time_scale=inputs.time_scale,
        git_commit=commit,
        sglang=tools.get("sglang (servers)"),
        router=tools.get("router (router node)"),
        pytest_kimi=tools.get("pytest-kimi"),
        complete=not incomplete,
        incomplete=tuple(incomplete),
    )


def experiment(inputs: Inputs, result: LayoutResult) -> dict[str, Any]:
    """What makes two results of a layout comparable: the workload point's settings, the
    prompts (their SHA-256), how they were built and timed, the seed and warm-up, the
    goodput limits and the backend."""
    point = _point(inputs, result.point)
    wl = inputs.workload_of(point)
    prompts = inputs.prompts_of(point).prompts_sha256 if inputs.workload is not None else None
    return {
        **workload_settings(inputs, result),
        "prompts_sha256": prompts,
        "speedbench_config": inputs.config_of(point),
        "prompt": inputs.prompt_style(point),
        "clock_start": wl.clock_start,
        "seed": wl.seed,
        "warmup_requests": wl.warmup_requests,
        "goodput": dict(wl.goodput),
        "backend": inputs.backend,
    }


def experiment_key(settings: Mapping[str, Any]) -> str:
    """A short digest of :func:`experiment`'s settings: equal settings, equal key."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def experiment_id(inputs: Inputs, result: LayoutResult) -> str:
    """The key of the result's experiment: the series it belongs to in the history."""
    return experiment_key(experiment(inputs, result))


def result_records(inputs: Inputs, results: Sequence[LayoutResult]) -> list[ResultRecord]:
    """Each (layout, point): figures and samples when measured, else why not."""
    out: list[ResultRecord] = []
    for result in results:
        settings = experiment(inputs, result)
        key = experiment_key(settings)
        if result.summary is None:
            out.append(ResultRecord(result.name, result.point, key, settings, {}, {},
                                    result.error or "not measured"))  # fmt: skip
            continue
        entry: dict[str, Any] = baseline_entry(inputs, result)
        samples = {**entry["samples"], **{f"{RUNS}{name}": values  # each run's figure
                                          for name, values in entry.get("runs", {}).items()}}
        out.append(ResultRecord(result.name, result.point, key, settings, entry["metrics"],
                                samples, result.error))  # fmt: skip
    return out


def _point(inputs: Inputs, point_id: str) -> Point:
    for point in inputs.points:
        if point.id == point_id:
            return point
    return inputs.points[0]


def baseline_entry(inputs: Inputs, result: LayoutResult) -> dict[str, Any]:
    """What a baseline keeps of one layout: its metrics and per-request samples; for a point
    measured in several runs (``--kimi-repeat``) each metric is the runs' mean, and ``runs``
    keeps each run's figure."""
    from pytest_kimi.results.metrics import per_request_ms

    assert result.summary is not None
    metrics = metrics_of(result.summary, inputs.baseline_metrics())
    entry: dict[str, Any] = {
        "label": result.label,
        "workload": workload_settings(inputs, result),
        "metrics": metrics,
        "samples": per_request_ms(result.records, time_scale=inputs.time_scale),
    }
    if result.between_runs:  # --kimi-repeat: a gate judges the runs' mean by their spread
        spreads = {name: result.between_runs[name] for name in metrics
                   if name in result.between_runs}  # fmt: skip
        metrics.update({name: spread.mean for name, spread in spreads.items()})
        entry["runs"] = {name: list(spread.values) for name, spread in spreads.items()}
    return entry


def workload_settings(inputs: Inputs, result: LayoutResult) -> dict[str, Any]:
    """The settings a workload point can change, as this result ran them: a baseline judged
    against another workload (concurrency 32 then 8) would compare different experiments."""
    from pytest_kimi.config.points import SWEPT, jsonable

    wl = inputs.cluster.workload
    ran = {name: getattr(wl, name) for name in SWEPT}
    ran.update(result.point_settings or {})
    return {name: jsonable(value) for name, value in ran.items()}
